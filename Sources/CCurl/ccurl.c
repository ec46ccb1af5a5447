#include "ccurl.h"

CURLcode zdc_curl_setopt_long(CURL *h, CURLoption o, long v) { return curl_easy_setopt(h, o, v); }
CURLcode zdc_curl_setopt_string(CURL *h, CURLoption o, const char *v) { return curl_easy_setopt(h, o, v); }
CURLcode zdc_curl_setopt_pointer(CURL *h, CURLoption o, void *v) { return curl_easy_setopt(h, o, v); }
CURLcode zdc_curl_setopt_off_t(CURL *h, CURLoption o, curl_off_t v) { return curl_easy_setopt(h, o, v); }
CURLcode zdc_curl_setopt_slist(CURL *h, CURLoption o, struct curl_slist *v) { return curl_easy_setopt(h, o, v); }
CURLcode zdc_curl_setopt_write_callback(CURL *h, size_t (*cb)(char *, size_t, size_t, void *)) {
  return curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, cb);
}
CURLcode zdc_curl_setopt_read_callback(CURL *h, size_t (*cb)(char *, size_t, size_t, void *)) {
  return curl_easy_setopt(h, CURLOPT_READFUNCTION, cb);
}
CURLcode zdc_curl_setopt_header_callback(CURL *h, size_t (*cb)(char *, size_t, size_t, void *)) {
  return curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, cb);
}
CURLcode zdc_curl_setopt_seek_callback(CURL *h, int (*cb)(void *, curl_off_t, int)) {
  return curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, cb);
}
CURLcode zdc_curl_getinfo_long(CURL *h, CURLINFO i, long *v) { return curl_easy_getinfo(h, i, v); }
CURLcode zdc_curl_getinfo_off_t(CURL *h, CURLINFO i, curl_off_t *v) { return curl_easy_getinfo(h, i, v); }
CURLMcode zdc_curl_multi_setopt_long(CURLM *m, CURLMoption o, long v) { return curl_multi_setopt(m, o, v); }
