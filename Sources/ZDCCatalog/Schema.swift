import GRDB

/// The catalog's schema, as ordered, named migrations. Append new migrations; never edit old ones.
enum Schema {
  static var migrator: DatabaseMigrator {
    var m = DatabaseMigrator()
    m.registerMigration("v1") { db in try v1(db) }
    m.registerMigration("v2") { db in try SyncSchema.v2(db) }
    m.registerMigration("v3") { db in try v3(db) }
    m.registerMigration("v4") { db in try v4(db) }
    m.registerMigration("v5") { db in try v5(db) }
    m.registerMigration("v6") { db in try v6(db) }
    m.registerMigration("v7") { db in try v7(db) }
    m.registerMigration("v8") { db in try v8(db) }
    return m
  }

  /// New nodes whose first uploads are not queued yet (see `DeferredUploads`): the node, its
  /// user, whether its content was committed (a DATA upload follows the RCRD) and when it last
  /// changed — made, or its content committed — (seconds since the reference date).
  private static func v8(_ db: Database) throws {
    try db.execute(
      sql: """
        CREATE TABLE deferredUploads (
          nodeID INTEGER PRIMARY KEY NOT NULL,
          localUserID TEXT NOT NULL,
          data INTEGER NOT NULL,
          since REAL NOT NULL
        );
        """)
  }

  /// Whether the sensitive fields are sealed (see `Catalog.Options.fieldKey`); a catalog from
  /// before this migration is not, until it is opened with a key.
  private static func v7(_ db: Database) throws {
    try db.execute(
      sql: """
        CREATE TABLE fieldSealing (id INTEGER PRIMARY KEY CHECK (id = 1), sealed INTEGER NOT NULL);
        INSERT INTO fieldSealing (id, sealed) VALUES (1, 0);
        """)
  }

  /// The redo journal's mark: the sequence number of the last journal entry the database
  /// holds (see `RedoJournal`).
  private static func v6(_ db: Database) throws {
    try db.execute(
      sql: """
        CREATE TABLE journalState (id INTEGER PRIMARY KEY CHECK (id = 1), seq INTEGER NOT NULL);
        INSERT INTO journalState (id, seq) VALUES (1, 0);
        """)
  }

  /// Fewer index pages written per node change: `nodes_parent` duplicates the leading column
  /// of `nodes_parent_nameKey`, and nothing looks nodes up by `uuid` (random, 122 bits).
  private static func v3(_ db: Database) throws {
    try db.execute(
      sql: """
        DROP INDEX nodes_parent;
        DROP INDEX nodes_uuid;
        """)
  }

  /// Children in id order again: a directory listing pages through a parent's children by id
  /// (readdir offsets), which `nodes_parent_nameKey` cannot serve without sorting them all on
  /// every page (quadratic in the directory's size). An index on `parentID` alone is ordered by
  /// id within a parent.
  private static func v4(_ db: Database) throws {
    try db.execute(sql: "CREATE INDEX nodes_parent_id ON nodes(parentID)")
  }

  /// A node's operations in id order without sorting them: every enqueue rule reads them, and
  /// with `(nodeID, kind, state)` each read built a temporary b-tree to order a handful of rows.
  private static func v5(_ db: Database) throws {
    try db.execute(
      sql: """
        DROP INDEX pushOperations_node;
        CREATE INDEX pushOperations_node ON pushOperations(nodeID);
        """)
  }

  private static func v1(_ db: Database) throws {
    try db.execute(
      sql: """
        CREATE TABLE localUsers (
          id TEXT PRIMARY KEY NOT NULL,
          treeID TEXT NOT NULL,
          boxPublicKey BLOB NOT NULL,
          signPublicKey BLOB NOT NULL,
          createdAt REAL NOT NULL,
          settings TEXT NOT NULL DEFAULT '{}'
        );

        CREATE TABLE nodes (
          id INTEGER PRIMARY KEY AUTOINCREMENT,
          uuid TEXT NOT NULL,
          localUserID TEXT NOT NULL REFERENCES localUsers(id),
          parentID INTEGER REFERENCES nodes(id) ON DELETE CASCADE,
          name TEXT NOT NULL,
          kind TEXT NOT NULL,
          trunk TEXT,
          shareList TEXT NOT NULL,
          burnDate REAL,
          encryptionKey BLOB NOT NULL,
          dirSalt BLOB NOT NULL,
          dirPrefix TEXT NOT NULL,
          cloudID TEXT NOT NULL,
          eTagRcrd TEXT,
          eTagData TEXT,
          lastModifiedRcrd REAL,
          lastModifiedData REAL,
          cloudDataInfo TEXT,
          explicitCloudName TEXT,
          anchor TEXT,
          pointeeID INTEGER,
          mode INTEGER NOT NULL,
          mtime INTEGER NOT NULL,
          xattrs TEXT,
          symlinkTarget TEXT,
          dataSize INTEGER NOT NULL DEFAULT 0,
          nameKey TEXT NOT NULL,
          cloudName TEXT NOT NULL
        );
        CREATE UNIQUE INDEX nodes_parent_nameKey ON nodes(parentID, nameKey);
        CREATE INDEX nodes_parent ON nodes(parentID);
        CREATE UNIQUE INDEX nodes_trunk ON nodes(localUserID, trunk) WHERE parentID IS NULL;
        CREATE UNIQUE INDEX nodes_uuid ON nodes(uuid);
        CREATE INDEX nodes_cloudID ON nodes(cloudID);
        CREATE INDEX nodes_dirPrefix ON nodes(dirPrefix, localUserID);
        CREATE INDEX nodes_parent_cloudName ON nodes(parentID, cloudName);

        CREATE TABLE nodeTags (
          nodeID INTEGER NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
          identifier TEXT NOT NULL,
          value,
          PRIMARY KEY (nodeID, identifier)
        ) WITHOUT ROWID;

        CREATE TABLE nodeLinks (
          nodeID INTEGER PRIMARY KEY NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
          localUserID TEXT NOT NULL,
          collection TEXT NOT NULL,
          key TEXT NOT NULL
        );
        CREATE UNIQUE INDEX nodeLinks_key ON nodeLinks(localUserID, collection, key);

        CREATE TABLE pushOperations (
          id INTEGER PRIMARY KEY AUTOINCREMENT,
          localUserID TEXT NOT NULL REFERENCES localUsers(id),
          kind TEXT NOT NULL,
          nodeID INTEGER,
          cloudID TEXT,
          payload TEXT NOT NULL DEFAULT '{}',
          state TEXT NOT NULL DEFAULT 'pending',
          attempts INTEGER NOT NULL DEFAULT 0,
          nextAttemptAt REAL NOT NULL,
          createdAt REAL NOT NULL,
          generation INTEGER NOT NULL DEFAULT 0,
          multipartState TEXT
        );
        CREATE INDEX pushOperations_node ON pushOperations(nodeID, kind, state);
        CREATE INDEX pushOperations_ready ON pushOperations(localUserID, state);

        CREATE TABLE pushOperationDeps (
          opID INTEGER NOT NULL REFERENCES pushOperations(id) ON DELETE CASCADE,
          dependsOnOpID INTEGER NOT NULL REFERENCES pushOperations(id) ON DELETE CASCADE,
          PRIMARY KEY (opID, dependsOnOpID)
        ) WITHOUT ROWID;
        CREATE INDEX pushOperationDeps_dependsOn ON pushOperationDeps(dependsOnOpID);
        """)
  }
}
