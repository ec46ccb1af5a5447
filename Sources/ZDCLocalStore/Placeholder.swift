// ZDCLocalStore
