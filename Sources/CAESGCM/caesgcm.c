#include "caesgcm.h"

#include <limits.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

enum { TAG = 16, NONCE = 12, KEY = 32, SLOTS = 8 };

// A context holds the expanded key and per-message state, so one serves one call at a time:
// each key keeps a few, claimed with an atomic flag; a call that finds them all busy uses a
// context of its own for that call.
struct zdc_gcm {
  EVP_CIPHER_CTX *ctx[SLOTS];
  atomic_flag busy[SLOTS];
  unsigned char key[KEY];
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static EVP_CIPHER *cipher;

static void fetch(void) { cipher = EVP_CIPHER_fetch(NULL, "AES-256-GCM", NULL); }

static EVP_CIPHER_CTX *keyed(const unsigned char *key) {
  EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
  if (ctx == NULL) return NULL;
  if (EVP_CipherInit_ex2(ctx, cipher, key, NULL, 1, NULL) != 1) {
    EVP_CIPHER_CTX_free(ctx);
    return NULL;
  }
  return ctx;
}

zdc_gcm *zdc_gcm_new(const unsigned char *key) {
  pthread_once(&once, fetch);
  if (cipher == NULL) return NULL;
  zdc_gcm *gcm = calloc(1, sizeof *gcm);
  if (gcm == NULL) return NULL;
  memcpy(gcm->key, key, KEY);
  for (int i = 0; i < SLOTS; i++) atomic_flag_clear(&gcm->busy[i]);
  // The first context now (every key is used at once); the others when first needed.
  gcm->ctx[0] = keyed(key);
  if (gcm->ctx[0] == NULL) {
    zdc_gcm_free(gcm);
    return NULL;
  }
  return gcm;
}

void zdc_gcm_free(zdc_gcm *gcm) {
  if (gcm == NULL) return;
  for (int i = 0; i < SLOTS; i++) EVP_CIPHER_CTX_free(gcm->ctx[i]);
  OPENSSL_cleanse(gcm->key, KEY);
  free(gcm);
}

// A context keyed with `gcm`'s key for this call: a claimed slot (`*slot` its index) or, when
// all are busy, a new one (`*slot` = -1) the caller frees.
static EVP_CIPHER_CTX *claim(zdc_gcm *gcm, int *slot) {
  for (int i = 0; i < SLOTS; i++) {
    if (atomic_flag_test_and_set_explicit(&gcm->busy[i], memory_order_acquire)) continue;
    if (gcm->ctx[i] == NULL) gcm->ctx[i] = keyed(gcm->key);
    if (gcm->ctx[i] == NULL) {
      atomic_flag_clear_explicit(&gcm->busy[i], memory_order_release);
      break;
    }
    *slot = i;
    return gcm->ctx[i];
  }
  *slot = -1;
  return keyed(gcm->key);
}

static void release(zdc_gcm *gcm, EVP_CIPHER_CTX *ctx, int slot) {
  if (slot < 0) {
    EVP_CIPHER_CTX_free(ctx);
  } else {
    atomic_flag_clear_explicit(&gcm->busy[slot], memory_order_release);
  }
}

// One message through a claimed context: associated data, then the text. `enc` 1 seals, 0
// opens (the tag is set before the final call, which checks it). Returns 0, -1 on a tag
// mismatch, -2 on any other failure.
static int run(EVP_CIPHER_CTX *ctx, int enc, unsigned char *out, const unsigned char *in,
               size_t length, const unsigned char *ad, size_t ad_length,
               const unsigned char *nonce, unsigned char *tag) {
  int n = 0;
  if (length > INT_MAX || ad_length > INT_MAX) return -2;
  if (EVP_CipherInit_ex2(ctx, NULL, NULL, nonce, enc, NULL) != 1) return -2;
  if (ad_length > 0 && EVP_CipherUpdate(ctx, NULL, &n, ad, (int)ad_length) != 1) return -2;
  if (length > 0 && EVP_CipherUpdate(ctx, out, &n, in, (int)length) != 1) return -2;
  if (!enc && EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, TAG, tag) != 1) return -2;
  if (EVP_CipherFinal_ex(ctx, out + length, &n) != 1) return enc ? -2 : -1;
  if (enc && EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, TAG, tag) != 1) return -2;
  return 0;
}

int zdc_gcm_seal(zdc_gcm *gcm, unsigned char *out, const unsigned char *in, size_t length,
                 const unsigned char *ad, size_t ad_length, const unsigned char *nonce) {
  int slot;
  EVP_CIPHER_CTX *ctx = claim(gcm, &slot);
  if (ctx == NULL) return -1;
  int rc = run(ctx, 1, out, in, length, ad, ad_length, nonce, out + length);
  release(gcm, ctx, slot);
  return rc == 0 ? 0 : -1;
}

int zdc_gcm_open(zdc_gcm *gcm, unsigned char *out, const unsigned char *in, size_t length,
                 const unsigned char *ad, size_t ad_length, const unsigned char *nonce) {
  if (length < TAG) return -1;
  size_t text = length - TAG;
  // The tag is copied first: `out` may be `in`, and decrypting in place overwrites nothing
  // beyond `text`, but the copy keeps the tag's bytes independent of `out` either way.
  unsigned char tag[TAG];
  memcpy(tag, in + text, TAG);
  int slot;
  EVP_CIPHER_CTX *ctx = claim(gcm, &slot);
  if (ctx == NULL) return -2;
  int rc = run(ctx, 0, out, in, text, ad, ad_length, nonce, tag);
  release(gcm, ctx, slot);
  if (rc == -1 && text > 0) OPENSSL_cleanse(out, text);
  return rc;
}
