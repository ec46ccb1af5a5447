#ifndef ZDC_CFUSE3_SYSTEM_H
#define ZDC_CFUSE3_SYSTEM_H
#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 314
#endif
#include <fuse_lowlevel.h>
#endif
