// Package ibv binds the parts of libibverbs (rdma-core) that te's rdma
// transport needs. The library is loaded at run time with purego, so te builds
// and runs on machines without rdma-core: Load reports why verbs are not
// available instead of failing to link.
//
// Three kinds of entry points exist in verbs.h and each is reached the way the
// header reaches it:
//
//   - exported functions (ibv_open_device, ibv_reg_mr, ibv_modify_qp, ...) are
//     looked up with dlsym and called through purego;
//   - static inline functions that call through the context's ops table
//     (ibv_post_send, ibv_post_recv, ibv_poll_cq, ibv_req_notify_cq) read the
//     function pointer from struct ibv_context_ops and call it;
//   - macros over extended entry points (ibv_query_port goes through
//     verbs_context->query_port when the provider has it) repeat the header's
//     logic in Go.
//
// Every struct handed to the library lives in memory from mmap (see Scratch),
// never on the Go heap: the library reads and writes it, and no Go pointer
// may cross into C. The Go mirrors of the C structs carry explicit padding and
// a test compares every field's offset and size with the real headers.
package ibv
