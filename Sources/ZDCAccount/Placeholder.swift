// ZDCAccount
