import CCurl
import CFuse

print("zdc (fuse \(zdc_fuse_runtime_version()), curl \(String(cString: curl_version())))")
