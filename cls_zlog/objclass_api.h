// Declarations of the RADOS object class API that /usr/bin/ceph-osd exports
// (Ceph 16 "pacific"). Debian packages no objclass.h, so the prototypes we use
// are declared here; they must match `nm -D /usr/bin/ceph-osd | c++filt`.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include <rados/buffer.h>

#define CLS_API __attribute__((visibility("default")))

typedef void* cls_handle_t;
typedef void* cls_method_handle_t;
typedef void* cls_method_context_t;
typedef int (*cls_method_cxx_call_t)(cls_method_context_t ctx, ceph::bufferlist* in,
                                     ceph::bufferlist* out);

// Method flags (src/include/rados/objclass.h).
constexpr int CLS_METHOD_RD = 0x1;
constexpr int CLS_METHOD_WR = 0x2;

extern "C" {
int cls_register(const char* name, cls_handle_t* handle);
int cls_log(int level, const char* format, ...) __attribute__((format(printf, 2, 3)));
}

int cls_register_cxx_method(cls_handle_t hclass, const char* method, int flags,
                            cls_method_cxx_call_t class_call, cls_method_handle_t* handle);

int cls_cxx_create(cls_method_context_t hctx, bool exclusive);
int cls_cxx_stat(cls_method_context_t hctx, uint64_t* size, time_t* mtime);
int cls_cxx_read(cls_method_context_t hctx, int ofs, int len, ceph::bufferlist* bl);
int cls_cxx_write(cls_method_context_t hctx, int ofs, int len, ceph::bufferlist* bl);
int cls_cxx_write_full(cls_method_context_t hctx, ceph::bufferlist* bl);
int cls_cxx_truncate(cls_method_context_t hctx, int ofs);

int cls_cxx_map_read_header(cls_method_context_t hctx, ceph::bufferlist* outbl);
int cls_cxx_map_write_header(cls_method_context_t hctx, ceph::bufferlist* inbl);
int cls_cxx_map_get_val(cls_method_context_t hctx, const std::string& key,
                        ceph::bufferlist* outbl);
int cls_cxx_map_set_val(cls_method_context_t hctx, const std::string& key,
                        ceph::bufferlist* inbl);
int cls_cxx_map_set_vals(cls_method_context_t hctx,
                         const std::map<std::string, ceph::bufferlist>* map);
int cls_cxx_map_get_vals(cls_method_context_t hctx, const std::string& start_after,
                         const std::string& filter_prefix, uint64_t max_to_get,
                         std::map<std::string, ceph::bufferlist>* vals, bool* more);
int cls_cxx_map_remove_range(cls_method_context_t hctx, const std::string& key_begin,
                             const std::string& key_end);
