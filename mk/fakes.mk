# The fake fabric (issue 20): a software libibverbs, a fake CUDA driver and
# a fake HIP runtime that two processes on one machine share, and the
# recorded sysfs trees they (and package topo) read.
#
#   make fakes    build/fake/libibverbs.so.1   (internal/sys/ibv/ibvtest/testdata/fakeverbs.c)
#                 build/fake/libcuda.so.1      (internal/sys/cuda/cudatest/testdata/fakecuda.c)
#                 build/fake/libamdhip64.so    (internal/sys/hip/hiptest/testdata/fakehip.c)
#                 build/fake/sysfs/{hgx8,nic1socket,box1}   (internal/sys/topo/testdata/*.tree)
#
# Point te at them with TE_IBV_LIBRARY, TE_CUDA_LIBRARY, TE_HIP_LIBRARY and
# TE_SYSFS_ROOT;
# processes that set the same FAKEVERBS_FABRIC directory share one fabric
# (README.md, "Fake fabric"). The Go tests build the same sources
# themselves (ibvtest.Build, cudatest.BuildFake, hiptest.BuildFake).
.PHONY: fakes

CC ?= cc
FAKE := $(BUILD)/fake
FAKE_TREES := $(patsubst internal/sys/topo/testdata/%.tree,$(FAKE)/sysfs/%/.stamp,$(wildcard internal/sys/topo/testdata/*.tree))

fakes: $(FAKE)/libibverbs.so.1 $(FAKE)/libcuda.so.1 $(FAKE)/libamdhip64.so $(FAKE_TREES)

$(FAKE)/libibverbs.so.1: internal/sys/ibv/ibvtest/testdata/fakeverbs.c
	@mkdir -p $(@D)
	@test -f /usr/include/infiniband/verbs.h || { echo "the fake libibverbs needs verbs.h: apt-get install libibverbs-dev"; exit 1; }
	$(CC) -O2 -Wall -Werror -shared -fPIC -Wl,-Bsymbolic -Wl,-soname,libibverbs.so.1 -o $@ $< -lpthread

$(FAKE)/libcuda.so.1: internal/sys/cuda/cudatest/testdata/fakecuda.c
	@mkdir -p $(@D)
	$(CC) -O2 -Wall -Werror -shared -fPIC -Wl,-soname,libcuda.so.1 -o $@ $< -lpthread

$(FAKE)/libamdhip64.so: internal/sys/hip/hiptest/testdata/fakehip.c
	@mkdir -p $(@D)
	$(CC) -O2 -Wall -Werror -shared -fPIC -Wl,-soname,libamdhip64.so -o $@ $< -lpthread

# A manifest line is "d PATH", "f PATH VALUE" or "l PATH TARGET" (topo.Materialize).
$(FAKE)/sysfs/%/.stamp: internal/sys/topo/testdata/%.tree
	@rm -rf $(@D) && mkdir -p $(@D)
	@while read -r kind path rest; do \
		case "$$kind" in \
		d) mkdir -p "$(@D)/$$path" ;; \
		f) mkdir -p "$$(dirname "$(@D)/$$path")" && printf '%s\n' "$$rest" >"$(@D)/$$path" ;; \
		l) mkdir -p "$$(dirname "$(@D)/$$path")" && ln -s "$$rest" "$(@D)/$$path" ;; \
		esac; \
	done <$<
	@touch $@
	@echo "$(@D): sysfs tree from $<"
