// ZDCCatalog
