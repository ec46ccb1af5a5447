// CAESGCM: AES-256-GCM over OpenSSL's libcrypto (EVP), for the local cache's CryptoFiles.
// OpenSSL's implementation uses the processor's vector AES and carry-less multiplication
// (VAES, VPCLMULQDQ) where present: several times libsodium 1.0.18's throughput.
#ifndef ZDC_CAESGCM_H
#define ZDC_CAESGCM_H

#include <stddef.h>

/// One expanded AES-256 key, usable from many threads at once.
typedef struct zdc_gcm zdc_gcm;

/// Expands a 32-byte key; NULL when libcrypto cannot (out of memory, no AES-256-GCM).
zdc_gcm *zdc_gcm_new(const unsigned char *key);

/// Clears and frees a key made by `zdc_gcm_new` (no other call may be using it).
void zdc_gcm_free(zdc_gcm *gcm);

/// Encrypts `length` bytes of `in` into `out` and appends the 16-byte tag (`out` receives
/// `length + 16` bytes and may be `in` itself), under a 12-byte nonce and `ad_length` bytes of
/// associated data. Returns 0, or -1 when libcrypto fails.
int zdc_gcm_seal(zdc_gcm *gcm, unsigned char *out, const unsigned char *in, size_t length,
                 const unsigned char *ad, size_t ad_length, const unsigned char *nonce);

/// Authenticates and decrypts `length` bytes of ciphertext followed by its 16-byte tag into
/// `out` (`length - 16` bytes; may be `in` itself). Returns 0; -1 when authentication fails
/// (`out` is then zeroed: no unauthenticated byte is left there); -2 when libcrypto fails.
int zdc_gcm_open(zdc_gcm *gcm, unsigned char *out, const unsigned char *in, size_t length,
                 const unsigned char *ad, size_t ad_length, const unsigned char *nonce);

#endif
