/* Compiled as C and as C++ with every warning that matters to a header
 * (tests/c/header.cmake): te.h must add none to its users' builds. */
#include "te.h"
#include "te.h" /* the include guard holds */

int main(void) {
    te_config_t cfg = TE_CONFIG_INIT;
    te_stats_t stats = {sizeof stats, 0, 0, 0, 0, 0, 0, 0};
    te_request_t req = {TE_WRITE, 0, NULL, 0, 0, 1};
    te_task_status_t ts;
    te_batch_status_t bs;
    te_probe_t probe;
    te_layout_info_t li;
    te_plan_stats_t ps;
    te_handoff_result_t hr;
    te_handoff_status_t hs;
    (void)cfg;
    (void)stats;
    (void)req;
    (void)ts;
    (void)bs;
    (void)probe;
    (void)li;
    (void)ps;
    (void)hr;
    (void)hs;
    return TE_ABI_VERSION == ((TE_ABI_VERSION_MAJOR << 16) | TE_ABI_VERSION_MINOR) ? 0 : 1;
}
