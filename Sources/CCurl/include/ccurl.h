// CCurl: typed wrappers over libcurl's variadic setters, callable from Swift.
#ifndef ZDC_CCURL_H
#define ZDC_CCURL_H
#include <curl/curl.h>

CURLcode zdc_curl_setopt_long(CURL *handle, CURLoption option, long value);
CURLcode zdc_curl_setopt_string(CURL *handle, CURLoption option, const char *value);
CURLcode zdc_curl_setopt_pointer(CURL *handle, CURLoption option, void *value);
CURLcode zdc_curl_setopt_off_t(CURL *handle, CURLoption option, curl_off_t value);
CURLcode zdc_curl_setopt_slist(CURL *handle, CURLoption option, struct curl_slist *value);
CURLcode zdc_curl_setopt_write_callback(CURL *handle, size_t (*cb)(char *, size_t, size_t, void *));
CURLcode zdc_curl_setopt_read_callback(CURL *handle, size_t (*cb)(char *, size_t, size_t, void *));
CURLcode zdc_curl_setopt_header_callback(CURL *handle, size_t (*cb)(char *, size_t, size_t, void *));
CURLcode zdc_curl_setopt_seek_callback(CURL *handle, int (*cb)(void *, curl_off_t, int));
CURLcode zdc_curl_getinfo_long(CURL *handle, CURLINFO info, long *value);
CURLcode zdc_curl_getinfo_off_t(CURL *handle, CURLINFO info, curl_off_t *value);
CURLMcode zdc_curl_multi_setopt_long(CURLM *multi, CURLMoption option, long value);

#endif
