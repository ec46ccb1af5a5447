// CSQLiteTuning: typed wrappers over SQLite's variadic process-wide configuration, callable
// from Swift.
#ifndef ZDC_CSQLITETUNING_H
#define ZDC_CSQLITETUNING_H

/// Configures SQLite for this process once, before its first connection opens: no memory
/// statistics, which put a global mutex around every allocation. Returns 0 when applied, or
/// SQLite's error code when SQLite was already initialized in this process (its defaults then
/// stay; nothing else changes).
int zdc_sqlite_tune_process(void);

#endif
