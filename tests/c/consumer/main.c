/* Built against an installed te: starts and stops an engine. */
#include <stdio.h>
#include <te.h>

int main(void) {
    if (te_abi_version() != TE_ABI_VERSION) {
        fprintf(stderr, "abi %#x, header %#x\n", te_abi_version(), TE_ABI_VERSION);
        return 1;
    }
    te_config_t cfg = TE_CONFIG_INIT;
    cfg.listen_addr = "127.0.0.1:0";
    te_engine_t e;
    char name[256];
    if (te_create(&cfg, &e) != 0 || te_segment_name(e, name, sizeof name) != 0 || te_destroy(e) != 0) {
        te_last_error(name, sizeof name);
        fprintf(stderr, "consumer: %s\n", name);
        return 1;
    }
    printf("consumer: ok (%s)\n", name);
    return 0;
}
