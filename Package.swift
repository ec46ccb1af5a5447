// swift-tools-version: 6.1
import PackageDescription

let strict: [SwiftSetting] = [
  .enableUpcomingFeature("ExistentialAny"),
  .enableUpcomingFeature("InternalImportsByDefault"),
  // Release builds leave out the run-time exclusivity checks (a call into the runtime on
  // every access to a class's stored property, about 6% of the engine's instructions per
  // file operation); debug builds, which every test runs, keep them.
  .unsafeFlags(["-enforce-exclusivity=unchecked"], .when(configuration: .release)),
]

let package = Package(
  name: "zdcfs",
  platforms: [.macOS(.v14)],
  products: [
    .executable(name: "zdc", targets: ["zdc"]),
    .library(name: "ZDCCore", targets: ["ZDCCore"]),
  ],
  dependencies: [
    .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
    .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
    .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
  ],
  targets: [
    // System libraries (Debian -dev packages, found through pkg-config).
    .systemLibrary(
      name: "CSodium", path: "Sources/CSodium", pkgConfig: "libsodium",
      providers: [.apt(["libsodium-dev"])]),
    .systemLibrary(
      name: "CCurlSystem", path: "Sources/CCurlSystem", pkgConfig: "libcurl",
      providers: [.apt(["libcurl4-openssl-dev"])]),
    .target(name: "CCurl", dependencies: ["CCurlSystem"], path: "Sources/CCurl"),
    .systemLibrary(
      name: "COpenSSLSystem", path: "Sources/COpenSSLSystem", pkgConfig: "libcrypto",
      providers: [.apt(["libssl-dev"])]),
    .target(name: "CAESGCM", dependencies: ["COpenSSLSystem"], path: "Sources/CAESGCM"),
    .target(name: "CLinux", path: "Sources/CLinux"),
    .target(
      name: "CSQLiteTuning", dependencies: [.product(name: "GRDBSQLite", package: "GRDB.swift")],
      path: "Sources/CSQLiteTuning"),
    .systemLibrary(
      name: "CFuse3", path: "CFuse/system", pkgConfig: "fuse3",
      providers: [.apt(["libfuse3-dev"])]),
    // liburing (Debian liburing-dev) for FUSE over io_uring.
    .target(
      name: "CFuse", dependencies: ["CFuse3"], path: "CFuse/shim",
      linkerSettings: [.linkedLibrary("uring")]),

    // Layers, dependencies pointing one way (DESIGN §2).
    .target(
      name: "ZDCCore",
      dependencies: ["CLinux"],
      swiftSettings: strict),
    .target(
      name: "ZDCCrypto",
      dependencies: ["ZDCCore", "CSodium", "CAESGCM", "CLinux"],
      swiftSettings: strict),
    .target(
      name: "ZDCSQLite",
      dependencies: [
        "CLinux",
        .product(name: "GRDB", package: "GRDB.swift"),
        .product(name: "GRDBSQLite", package: "GRDB.swift"),
        .product(name: "Logging", package: "swift-log"),
      ],
      swiftSettings: strict),
    .target(
      name: "ZDCCatalog",
      dependencies: [
        "ZDCCore", "ZDCCrypto", "CLinux", "CSQLiteTuning", "ZDCSQLite",
        .product(name: "GRDB", package: "GRDB.swift"),
        .product(name: "GRDBSQLite", package: "GRDB.swift"),
        .product(name: "Logging", package: "swift-log"),
      ],
      swiftSettings: strict),
    .target(
      name: "ZDCLocalStore",
      dependencies: ["ZDCCore", "CSodium", "CLinux"],
      swiftSettings: strict),
    .target(
      name: "ZDCDisk",
      dependencies: [
        "ZDCCore", "ZDCCrypto", "CLinux", "CSQLiteTuning", "ZDCSQLite",
        .product(name: "GRDB", package: "GRDB.swift"),
        .product(name: "Logging", package: "swift-log"),
      ],
      swiftSettings: strict),
    .target(
      name: "ZDCSync",
      dependencies: [
        "ZDCCore", "ZDCCrypto", "ZDCCatalog", "ZDCDisk", "CSodium",
        .product(name: "Logging", package: "swift-log"),
      ],
      swiftSettings: strict),
    .target(
      name: "ZDCAccount",
      dependencies: [
        "ZDCCore", "ZDCCrypto", "ZDCCatalog", "ZDCLocalStore", "ZDCS3Store",
        .product(name: "Logging", package: "swift-log"),
      ],
      swiftSettings: strict),
    .target(
      name: "ZDCS3Store",
      dependencies: [
        "ZDCCore", "CCurl", "CSodium", .product(name: "Logging", package: "swift-log"),
      ],
      swiftSettings: strict),
    .target(
      name: "ZDCFileSystem",
      dependencies: [
        "ZDCCore", "ZDCCrypto", "ZDCCatalog", "ZDCDisk", "ZDCSync",
        .product(name: "Logging", package: "swift-log"),
      ],
      swiftSettings: strict),
    .target(
      name: "ZDCFuse",
      dependencies: [
        "CFuse", "ZDCCore", "ZDCFileSystem", .product(name: "Logging", package: "swift-log"),
      ],
      swiftSettings: strict),
    .executableTarget(
      name: "zdc",
      dependencies: [
        "ZDCCore", "ZDCCrypto", "ZDCCatalog", "ZDCLocalStore", "ZDCS3Store", "ZDCAccount", "CFuse",
        "CCurl", "CLinux",
        "ZDCDisk", "ZDCSync", "ZDCFileSystem", "ZDCFuse",
        .product(name: "ArgumentParser", package: "swift-argument-parser"),
        .product(name: "Logging", package: "swift-log"),
      ],
      swiftSettings: strict),
    .executableTarget(
      name: "zdc-testhelper",
      dependencies: [
        "ZDCCore", "ZDCLocalStore", "ZDCS3Store", "ZDCSync", "ZDCCatalog", "ZDCCrypto",
      ],
      swiftSettings: strict),
    .executableTarget(
      name: "zdc-bench",
      dependencies: [
        "ZDCCore", "ZDCCrypto", "CSodium", "ZDCCatalog", "ZDCLocalStore", "ZDCSync", "ZDCDisk",
        "ZDCFileSystem",
      ],
      swiftSettings: strict),

    .target(
      name: "ZDCTestSupport",
      dependencies: ["ZDCCore", "ZDCS3Store", "CSpawn"],
      path: "Tests/ZDCTestSupport",
      swiftSettings: strict),
    .target(name: "CSpawn", path: "Tests/CSpawn"),
    .testTarget(
      name: "ZDCS3StoreTests",
      dependencies: ["ZDCS3Store", "ZDCCore", "ZDCTestSupport", "zdc-testhelper"],
      swiftSettings: strict),
    .testTarget(name: "ZDCCoreTests", dependencies: ["ZDCCore", "CLinux"], swiftSettings: strict),
    .testTarget(
      name: "ZDCCryptoTests", dependencies: ["ZDCCore", "ZDCCrypto", "CSodium"],
      swiftSettings: strict),
    .testTarget(
      name: "ZDCCatalogTests",
      dependencies: [
        "ZDCCore", "ZDCCrypto", "ZDCCatalog", "ZDCSQLite", "ZDCTestSupport",
        .product(name: "GRDB", package: "GRDB.swift"),
      ],
      swiftSettings: strict),
    .testTarget(
      name: "ZDCStoreTests",
      dependencies: ["ZDCCore", "ZDCLocalStore", "ZDCS3Store", "ZDCTestSupport", "zdc-testhelper"],
      swiftSettings: strict),
    .testTarget(
      name: "ZDCAccountTests",
      dependencies: [
        "ZDCCore", "ZDCCrypto", "ZDCCatalog", "ZDCLocalStore", "ZDCAccount", "ZDCS3Store",
        "ZDCTestSupport", "zdc",
      ],
      swiftSettings: strict),
    .testTarget(
      name: "ZDCDiskTests",
      dependencies: ["ZDCCore", "ZDCCrypto", "ZDCDisk", "ZDCTestSupport"],
      swiftSettings: strict),
    .testTarget(
      name: "ZDCSyncTests",
      dependencies: [
        "ZDCCore", "ZDCCrypto", "ZDCCatalog", "ZDCSync", "ZDCDisk", "ZDCLocalStore", "ZDCS3Store",
        "ZDCTestSupport", "zdc-testhelper",
      ],
      swiftSettings: strict),
    .testTarget(
      name: "ZDCMountTests",
      dependencies: [
        "ZDCCore", "ZDCCrypto", "ZDCCatalog", "ZDCDisk", "ZDCSync", "ZDCLocalStore", "ZDCS3Store",
        "ZDCFileSystem", "ZDCFuse", "CFuse", "ZDCTestSupport", "zdc",
      ],
      swiftSettings: strict),
    .testTarget(
      name: "ZDCIntegrationTests",
      dependencies: ["ZDCCore", "ZDCCrypto", "ZDCCatalog", "ZDCAccount", "ZDCTestSupport"],
      swiftSettings: strict),
  ],
  swiftLanguageModes: [.v6]
)
