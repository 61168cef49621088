/*
 * A software libibverbs for tests: the entry points te's ibv package binds,
 * with the real rdma-core structs (compiled against verbs.h), and a fabric
 * that connects queue pairs as an RDMA network does. RDMA READ and WRITE
 * are checked as a NIC checks them (lkey on the local device, rkey on the
 * device of the connected remote queue pair, bounds, access flags, queue
 * pair state) and executed by a thread per device ("the NIC"), after
 * ibv_post_send has returned; completions go to the send CQ and wake its
 * completion channel when armed.
 *
 * One source serves two uses:
 *
 *  - In-process (FAKEVERBS_FABRIC unset): the fabric is private to the
 *    process; every queue pair of every context of the process can reach
 *    every other. Package ibvtest compiles it per test (ibvtest.Build).
 *
 *  - Between processes (FAKEVERBS_FABRIC=DIR): processes that name the
 *    same directory share one fabric, kept in DIR/fabric (a memory-mapped
 *    file holding the memory regions, queue pairs and processes, under a
 *    process-shared robust mutex). Keys and queue pair numbers are unique
 *    on the fabric; a work request's bytes move with process_vm_readv /
 *    process_vm_writev between the initiator and the process that
 *    registered the remote region (the library allows any process of the
 *    same user to do so: prctl PR_SET_PTRACER). `make fakes` builds it as
 *    build/fake/libibverbs.so.1.
 *
 * Devices: the names under $TE_SYSFS_ROOT/class/infiniband (sorted), or
 * fake0 and fake1 without TE_SYSFS_ROOT. GIDs are fe80::<process><device>,
 * distinct per process, so two processes are two hosts to te.
 *
 * GPU memory: ibv_reg_dmabuf_mr maps the dma-buf fd (the fake CUDA driver's
 * cuMemGetHandleForAddressRange gives one) and serves the region from that
 * mapping; ibv_reg_mr of fake device memory (mapped PROT_NONE by the fake
 * driver) does what nvidia-peermem does, mapping the same pages. Knobs:
 * FAKEVERBS_DMABUF=0 makes ibv_reg_dmabuf_mr fail with EOPNOTSUPP (an old
 * provider), FAKEVERBS_PEERMEM=0 makes ibv_reg_mr of device memory fail
 * with EFAULT (no peer-memory module). Memory that is not mapped, or
 * mapped without access, fails with EFAULT as on a NIC.
 *
 * Control file: DIR/control (or $FAKEVERBS_CONTROL) is read whenever it
 * changes (checked every 20 ms), one rule per line, applied in order after
 * resetting every device to healthy and unlimited:
 *
 *     NAME[@PID] fail        work requests through the device (either end)
 *                            complete with IBV_WC_RETRY_EXC_ERR at once
 *     NAME[@PID] down        the link is down: a work request through the
 *                            device (either end) is retransmitted, holding
 *                            its queue pair, until the queue pair's retry
 *                            timer runs out (its timeout and retry_cnt:
 *                            4.096 us << timeout, retry_cnt + 1 times), then
 *                            completes with IBV_WC_RETRY_EXC_ERR, as a NIC
 *                            reports a dead link or a dead peer NIC; moving
 *                            the queue pair to the error state flushes it
 *                            at once; a link that is back ("ok") when the
 *                            timer runs out lets it through
 *     NAME[@PID] ok          healthy again
 *     NAME[@PID] rate BPS    the device moves at most BPS bytes per second
 *
 * NAME "*" is every device; @PID limits the rule to one process; '#'
 * starts a comment. Once a process follows the file, it writes the file's
 * first line to CONTROL.applied.PID (a test writes a generation there and
 * waits for it). fake_verbs_control(line) applies one rule to this process
 * at once.
 *
 * A peer that stopped (SIGSTOP; its heartbeat in the fabric is older than
 * 500 ms) holds work requests back, as a peer that stopped answering does;
 * a dead one fails them with IBV_WC_RETRY_EXC_ERR. A queue pair moved to
 * the error state still flushes its own at once, as a NIC's does.
 *
 * It is test data: compiled at test time by package ibvtest, or by
 * mk/fakes.mk, and loaded instead of libibverbs.so.1 (ibv.Open,
 * rdma.library, TE_IBV_LIBRARY).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

#define MAXDEV 16
#define MAXPROC 64
#define MR_BITS 14
#define MAXMR (1 << MR_BITS)
#define QP_BITS 13
#define MAXQP (1 << QP_BITS)
#define FAB_MAGIC 0x46414256u /* "VBAF" */
#define FAB_VERSION 1
#define STALE_NS (500LL * 1000 * 1000)
#define BEAT_NS (20LL * 1000 * 1000)

/* ---- the shared fabric ------------------------------------------------ */

enum { NIC_OK, NIC_FAIL, NIC_DOWN };

struct fab_nic {
	int32_t failed; /* NIC_OK, NIC_FAIL or NIC_DOWN */
	int32_t pad;
	uint64_t rate; /* bytes per second, 0 = unlimited */
};

/* fab_exec is what one device of a process is copying right now: the
 * slots of the two memory regions, so that deregistering either waits. */
struct fab_exec {
	int32_t lslot, rslot;
};

struct fab_proc {
	int32_t pid;
	int32_t used;
	uint64_t beat; /* CLOCK_MONOTONIC ns of the last heartbeat */
	struct fab_nic nic[MAXDEV];
	struct fab_exec exec[MAXDEV];
};

struct fab_mr {
	uint32_t lkey, rkey;
	int32_t proc, dev, access;
	int32_t used, live; /* used: the slot is taken; live: the keys work */
	uint64_t iova, length;
	uint64_t backing; /* where the bytes are in the owner's address space */
};

struct fab_qp {
	uint32_t qpn, dest;
	int32_t proc, dev, state, used;
};

struct fabric {
	uint32_t magic, version;
	pthread_mutex_t mu;
	uint32_t gen_mr, gen_qp;
	struct fab_proc procs[MAXPROC];
	struct fab_mr mrs[MAXMR];
	struct fab_qp qps[MAXQP];
};

static struct fabric *fab;
static int me = -1; /* this process's slot in fab->procs */
static int self_pid; /* getpid() is a system call; the devices ask per work request */

static void forked_child(void) { self_pid = getpid(); }
static int shared_fabric;
static char control_path[4096];
static pthread_once_t fab_once = PTHREAD_ONCE_INIT;

static uint64_t now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void fab_lock(void) {
	int rc = pthread_mutex_lock(&fab->mu);
	if (rc == EOWNERDEAD) /* a process died holding it; the tables stay usable */
		pthread_mutex_consistent(&fab->mu);
}

static void fab_unlock(void) { pthread_mutex_unlock(&fab->mu); }

static void init_mutex(pthread_mutex_t *m) {
	pthread_mutexattr_t a;
	pthread_mutexattr_init(&a);
	pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(m, &a);
	pthread_mutexattr_destroy(&a);
}

/* proc_alive reports whether the process in slot p runs (a zombie does
 * not). Called with the fabric lock held or not; reads only. */
static int pid_alive(int pid) {
	if (pid == self_pid)
		return 1;
	if (kill(pid, 0) != 0 && errno == ESRCH)
		return 0;
	char path[64], buf[256];
	snprintf(path, sizeof path, "/proc/%d/stat", pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	char *p = strrchr(buf, ')');
	return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

static int beat_fresh(int p) {
	uint64_t beat = __atomic_load_n(&fab->procs[p].beat, __ATOMIC_RELAXED);
	return now_ns() - beat < (uint64_t)STALE_NS;
}

/* proc_alive reports whether the process in slot p runs: a fresh heartbeat
 * says so without a system call. */
static int proc_alive(int p) {
	if (p < 0 || p >= MAXPROC || !fab->procs[p].used)
		return 0;
	if (p == me || (shared_fabric && beat_fresh(p)))
		return 1;
	return pid_alive(fab->procs[p].pid);
}

/* proc_stalled: the process in slot p stopped beating (SIGSTOP) but lives.
 * Called with mu held; the answer for a stale process is kept 10 ms. */
static uint64_t stall_at[MAXPROC];
static int stall_val[MAXPROC];

static int proc_stalled(int p) {
	if (p == me || p < 0 || p >= MAXPROC || beat_fresh(p))
		return 0;
	uint64_t t = now_ns();
	if (t - stall_at[p] > 10 * 1000 * 1000) {
		stall_val[p] = pid_alive(fab->procs[p].pid);
		stall_at[p] = t;
	}
	return stall_val[p];
}

static void *heartbeat(void *);

static void fab_attach(void) {
	const char *dir = getenv("FAKEVERBS_FABRIC");
	const char *ctl = getenv("FAKEVERBS_CONTROL");
	if (dir && *dir) {
		char path[4096];
		mkdir(dir, 0700);
		snprintf(path, sizeof path, "%s/fabric", dir);
		int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (fd < 0) {
			fprintf(stderr, "fakeverbs: cannot open %s: %s\n", path, strerror(errno));
			abort();
		}
		flock(fd, LOCK_EX);
		struct stat st;
		fstat(fd, &st);
		int fresh = st.st_size < (off_t)sizeof(struct fabric);
		if (fresh && ftruncate(fd, sizeof(struct fabric)) != 0)
			abort();
		fab = mmap(NULL, sizeof(struct fabric), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (fab == MAP_FAILED)
			abort();
		if (fresh || fab->magic != FAB_MAGIC) {
			memset(fab, 0, sizeof *fab);
			init_mutex(&fab->mu);
			fab->version = FAB_VERSION;
			__atomic_store_n(&fab->magic, FAB_MAGIC, __ATOMIC_RELEASE);
		}
		flock(fd, LOCK_UN);
		close(fd);
		shared_fabric = 1;
		snprintf(control_path, sizeof control_path, "%s/control", dir);
		/* Let the other processes of the fabric reach this one's memory
		 * with process_vm_*, whatever Yama says (no-op without Yama). */
		prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
	} else {
		fab = calloc(1, sizeof *fab);
		if (!fab)
			abort();
		init_mutex(&fab->mu);
		fab->magic = FAB_MAGIC;
	}
	if (ctl && *ctl)
		snprintf(control_path, sizeof control_path, "%s", ctl);
	self_pid = getpid();
	pthread_atfork(NULL, NULL, forked_child);
	fab_lock();
	int pid = self_pid;
	for (int i = 0; i < MAXPROC && me < 0; i++) {
		struct fab_proc *p = &fab->procs[i];
		if (!p->used || !pid_alive(p->pid)) {
			/* A dead process's regions and queue pairs go with it:
			 * its keys must not reach this process's memory. */
			for (int k = 0; k < MAXMR; k++)
				if (fab->mrs[k].used && fab->mrs[k].proc == i)
					fab->mrs[k].used = fab->mrs[k].live = 0;
			for (int k = 0; k < MAXQP; k++)
				if (fab->qps[k].used && fab->qps[k].proc == i)
					fab->qps[k].used = 0;
			memset(p, 0, sizeof *p);
			p->used = 1;
			p->pid = pid;
			p->beat = now_ns();
			for (int d = 0; d < MAXDEV; d++)
				p->exec[d].lslot = p->exec[d].rslot = -1;
			me = i;
		}
	}
	fab_unlock();
	if (me < 0) {
		fprintf(stderr, "fakeverbs: more than %d processes on the fabric\n", MAXPROC);
		abort();
	}
	if (shared_fabric || control_path[0]) {
		pthread_t th;
		pthread_attr_t a;
		pthread_attr_init(&a);
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&th, &a, heartbeat, NULL) != 0)
			abort();
		pthread_attr_destroy(&a);
	}
}

static void attach(void) { pthread_once(&fab_once, fab_attach); }

/* ---- process-local state ----------------------------------------------- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct ibv_device devs[MAXDEV];
static int ndevices = -1; /* -1: not listed yet */
static int nlisted;
static int compat;  /* contexts without the extended query_port */
static int stalled; /* the far side does not answer: nothing executes */
static int no_dmabuf, no_peermem; /* knobs 3 and 4, as the environment's */
static uint64_t max_mr;            /* knob 5; 0: FAKEVERBS_MAX_MR_SIZE, else unbounded */
static long stats[16];

enum {
	ST_MRS,
	ST_QPS,
	ST_CQS,
	ST_IOVA2,
	ST_POSTED,
	ST_CONTEXTS,
	ST_CHANNELS,
	ST_PDS,
	ST_POSTS,
	ST_SIGNALED,
	ST_CQES,
	ST_DMABUF,
	ST_PEERMEM,
	ST_FAILED_NIC,
	ST_NIC_NS,
	ST_REGS
};

/* fake_verbs_stat returns a counter: live MRs, QPs, CQs, registrations
 * through ibv_reg_mr_iova2, work requests posted, open contexts, channels,
 * PDs, ibv_post_send calls, signaled work requests posted, completions
 * generated, registrations through ibv_reg_dmabuf_mr, registrations of
 * device memory through ibv_reg_mr (peer memory), work requests failed by
 * a failed device, CPU time (ns) of the devices' threads (what a real NIC
 * does without the host's CPU), memory regions ever registered (every
 * successful ibv_reg_mr, ibv_reg_mr_iova2 and ibv_reg_dmabuf_mr). */
static long nic_nanos(void);

long fake_verbs_stat(int what) {
	pthread_mutex_lock(&mu);
	long v = what >= 0 && what < 16 ? stats[what] : -1;
	if (what == ST_NIC_NS)
		v = nic_nanos();
	pthread_mutex_unlock(&mu);
	return v;
}

struct worker;
static void wake_workers(void);

/* fake_verbs_set sets a knob: 0 = number of devices (at most those listed),
 * 1 = compat contexts, 2 = stalled (work requests wait, as for a peer that
 * stopped answering; a queue pair moved to the error state still flushes
 * its own at once), 3 = no dma-buf registration (FAKEVERBS_DMABUF=0),
 * 4 = no peer memory (FAKEVERBS_PEERMEM=0), 5 = the devices' max_mr_size
 * (FAKEVERBS_MAX_MR_SIZE; 0 = that, else unbounded): ibv_query_device
 * reports it and a longer registration fails with EINVAL. */
void fake_verbs_set(int what, long val) {
	pthread_mutex_lock(&mu);
	if (what == 0)
		ndevices = val < 0 ? 0 : val > MAXDEV ? MAXDEV : (int)val;
	if (what == 1)
		compat = val != 0;
	if (what == 2)
		stalled = val != 0;
	if (what == 3)
		no_dmabuf = val != 0;
	if (what == 4)
		no_peermem = val != 0;
	if (what == 5)
		max_mr = val < 0 ? 0 : (uint64_t)val;
	pthread_mutex_unlock(&mu);
	wake_workers();
}

/* list_devices names the devices once: the sysfs tree's, or fake0/fake1. */
static int cmpstr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void list_devices(void) {
	if (nlisted > 0 || ndevices == 0)
		return;
	const char *root = getenv("TE_SYSFS_ROOT");
	char *names[MAXDEV];
	int n = 0;
	if (root && *root) {
		char path[4096];
		snprintf(path, sizeof path, "%s/class/infiniband", root);
		DIR *d = opendir(path);
		struct dirent *e;
		while (d && (e = readdir(d)) && n < MAXDEV)
			if (e->d_name[0] != '.')
				names[n++] = strdup(e->d_name);
		if (d)
			closedir(d);
		qsort(names, n, sizeof names[0], cmpstr);
	} else {
		for (; n < 2; n++) {
			names[n] = malloc(16);
			snprintf(names[n], 16, "fake%d", n);
		}
	}
	for (int i = 0; i < n; i++) {
		snprintf(devs[i].name, sizeof devs[i].name, "%s", names[i]);
		snprintf(devs[i].dev_name, sizeof devs[i].dev_name, "uverbs%d", i);
		free(names[i]);
	}
	nlisted = n;
	if (ndevices < 0 || ndevices > n)
		ndevices = n;
}

static int dev_index(struct ibv_context *ctx) { return (int)(ctx->device - devs); }


/* ---- control ------------------------------------------------------------ */

/* apply_rule applies one control rule to this process's devices (mu held
 * or not: it writes only this process's entries of the fabric). */
static void apply_rule(const char *line) {
	char name[128], verb[32];
	unsigned long long arg = 0;
	int k = sscanf(line, " %127s %31s %llu", name, verb, &arg);
	if (k < 2 || name[0] == '#')
		return;
	char *at = strchr(name, '@');
	if (at) {
		*at = 0;
		if (atoi(at + 1) != getpid())
			return;
	}
	for (int d = 0; d < nlisted; d++) {
		if (strcmp(name, "*") != 0 && strcmp(name, devs[d].name) != 0)
			continue;
		struct fab_nic *nic = &fab->procs[me].nic[d];
		if (strcmp(verb, "fail") == 0)
			__atomic_store_n(&nic->failed, NIC_FAIL, __ATOMIC_RELAXED);
		else if (strcmp(verb, "down") == 0)
			__atomic_store_n(&nic->failed, NIC_DOWN, __ATOMIC_RELAXED);
		else if (strcmp(verb, "ok") == 0)
			__atomic_store_n(&nic->failed, NIC_OK, __ATOMIC_RELAXED);
		else if (strcmp(verb, "rate") == 0 && k == 3)
			__atomic_store_n(&nic->rate, (uint64_t)arg, __ATOMIC_RELAXED);
	}
}

/* fake_verbs_control applies one control-file rule to this process now. */
void fake_verbs_control(const char *line) {
	attach();
	pthread_mutex_lock(&mu);
	list_devices();
	pthread_mutex_unlock(&mu);
	apply_rule(line);
	wake_workers();
}

/* read_control applies the control file, then writes its first line to
 * CONTROL.applied.PID, so a test knows when this process follows it. */
static void read_control(void) {
	FILE *f = fopen(control_path, "re");
	for (int d = 0; d < MAXDEV; d++) {
		__atomic_store_n(&fab->procs[me].nic[d].failed, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&fab->procs[me].nic[d].rate, 0, __ATOMIC_RELAXED);
	}
	char line[512], first[512] = "";
	for (int n = 0; f && fgets(line, sizeof line, f); n++) {
		if (n == 0)
			memcpy(first, line, sizeof first);
		apply_rule(line);
	}
	if (f)
		fclose(f);
	char path[4200], tmp[4300];
	snprintf(path, sizeof path, "%s.applied.%d", control_path, (int)getpid());
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	FILE *w = fopen(tmp, "we");
	if (w) {
		fputs(first, w);
		fclose(w);
		rename(tmp, path);
	}
}

/* heartbeat tells the fabric this process runs, and follows the control
 * file. The thread ends with the process. */
static void *heartbeat(void *arg) {
	(void)arg;
	struct timespec last = {0, 0};
	int had = 0;
	for (;;) {
		__atomic_store_n(&fab->procs[me].beat, now_ns(), __ATOMIC_RELAXED);
		struct stat st;
		int have = control_path[0] && stat(control_path, &st) == 0;
		if (have != had || (have && (st.st_mtim.tv_sec != last.tv_sec || st.st_mtim.tv_nsec != last.tv_nsec))) {
			pthread_mutex_lock(&mu);
			list_devices();
			pthread_mutex_unlock(&mu);
			if (have || had)
				read_control();
			if (have)
				last = st.st_mtim;
			had = have;
			wake_workers();
		}
		struct timespec ts = {0, BEAT_NS};
		nanosleep(&ts, NULL);
	}
	return NULL;
}

/* ---- devices, ports, contexts ------------------------------------------- */

struct ibv_device **ibv_get_device_list(int *num) {
	attach();
	pthread_mutex_lock(&mu);
	list_devices();
	int n = ndevices < 0 ? 0 : ndevices > nlisted ? nlisted : ndevices;
	pthread_mutex_unlock(&mu);
	struct ibv_device **l = calloc(n + 1, sizeof(*l));
	if (!l) {
		errno = ENOMEM;
		return NULL;
	}
	for (int i = 0; i < n; i++)
		l[i] = &devs[i];
	if (num)
		*num = n;
	return l;
}

void ibv_free_device_list(struct ibv_device **list) { free(list); }

const char *ibv_get_device_name(struct ibv_device *device) { return device->name; }

static void fill_port(struct ibv_context *ctx, struct ibv_port_attr *a, int lid_base) {
	memset(a, 0, sizeof(*a));
	a->state = IBV_PORT_ACTIVE;
	a->max_mtu = IBV_MTU_4096;
	a->active_mtu = IBV_MTU_4096;
	a->gid_tbl_len = 1;
	a->lid = (uint16_t)(lid_base + me * MAXDEV + dev_index(ctx) + 1);
	a->link_layer = IBV_LINK_LAYER_INFINIBAND;
}

static int ext_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *a, size_t len) {
	if (port != 1 || len < sizeof(*a))
		return EINVAL;
	fill_port(ctx, a, 0);
	return 0;
}

int ibv_query_port(struct ibv_context *ctx, uint8_t port, struct _compat_ibv_port_attr *attr) {
	if (port != 1)
		return EINVAL;
	/* The compat struct is the extended one without its last fields;
	 * LIDs from 100 tell the caller this path was taken. */
	struct ibv_port_attr a;
	fill_port(ctx, &a, 100);
	memcpy(attr, &a, offsetof(struct ibv_port_attr, flags));
	return 0;
}

struct fake_ctx {
	int dev;
	struct verbs_context v; /* v.context is what callers get */
};

struct fake_qp;

struct fake_cq {
	struct ibv_cq cq;
	struct ibv_wc *ring;
	/* Per ring entry: the queue pair and how many of its work requests the
	 * completion accounts for (its own and the unsignaled ones before it):
	 * polling it frees that much of the send queue, as on a NIC. */
	struct fake_qp **owner;
	int *covers;
	int cap, head, count, armed;
};

struct fake_ch {
	struct ibv_comp_channel ch;
	int wfd;
	struct fake_cq *cq;
};

struct fake_qp {
	struct ibv_qp qp;
	int dev;
	int slot; /* in fab->qps */
	uint32_t dest;
	int peer_proc; /* process of the connected queue pair */
	int max_send;
	int outstanding; /* send queue entries in use */
	int uncovered;   /* of them, not yet accounted for by a completion */
	int executing;   /* work requests the device is running now */
	uint64_t retry_ns;    /* how long the retry timer retransmits over a dead link */
	uint64_t stuck_until; /* retransmitting its oldest work request until then; 0: not */
	struct pending_wr *slots; /* max_send of them, used in posting order */
	unsigned posted;           /* work requests ever posted */
	struct fake_qp *next;
};

struct fake_mr {
	struct ibv_mr mr;
	int slot; /* in fab->mrs */
	void *map;
	size_t maplen; /* a mapping of its own (dma-buf, peer memory) */
};

static struct fake_qp *qps;
static pthread_cond_t cq_room = PTHREAD_COND_INITIALIZER; /* a poll freed CQ entries */
static pthread_cond_t exec_done = PTHREAD_COND_INITIALIZER;

static int poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) {
	struct fake_cq *c = (struct fake_cq *)cq;
	pthread_mutex_lock(&mu);
	int k = 0;
	for (; k < n && c->count > 0; k++) {
		wc[k] = c->ring[c->head];
		if (c->owner[c->head])
			c->owner[c->head]->outstanding -= c->covers[c->head];
		c->head = (c->head + 1) % c->cap;
		c->count--;
	}
	if (k > 0)
		pthread_cond_broadcast(&cq_room);
	pthread_mutex_unlock(&mu);
	return k;
}

static void signal_channel(struct fake_cq *c) {
	struct fake_ch *ch = (struct fake_ch *)c->cq.channel;
	if (c->armed && ch) {
		c->armed = 0;
		if (write(ch->wfd, "e", 1) != 1)
			abort();
	}
}

static int req_notify_cq(struct ibv_cq *cq, int solicited_only) {
	(void)solicited_only;
	struct fake_cq *c = (struct fake_cq *)cq;
	pthread_mutex_lock(&mu);
	c->armed = 1;
	pthread_mutex_unlock(&mu);
	return 0;
}

/* ---- fabric lookups (fabric lock held) ---------------------------------- */

static struct fab_mr *mr_by_key(uint32_t key, int rkey) {
	struct fab_mr *m = &fab->mrs[key & (MAXMR - 1)];
	if (!m->used || !m->live || (rkey ? m->rkey : m->lkey) != key)
		return NULL;
	return m;
}

static struct fab_qp *qp_by_num(uint32_t qpn) {
	struct fab_qp *q = &fab->qps[qpn & (MAXQP - 1)];
	return q->used && q->qpn == qpn ? q : NULL;
}

static int covers(struct fab_mr *m, uint64_t addr, uint32_t n) {
	return addr >= m->iova && addr + n >= addr && addr + n <= m->iova + m->length;
}

/* exec_refs reports whether a live process is copying through MR slot s. */
static int exec_refs(int s) {
	for (int p = 0; p < MAXPROC; p++) {
		if (!fab->procs[p].used)
			continue;
		for (int d = 0; d < MAXDEV; d++) {
			struct fab_exec *e = &fab->procs[p].exec[d];
			if ((e->lslot == s || e->rslot == s) && (p == me || pid_alive(fab->procs[p].pid)))
				return 1;
		}
	}
	return 0;
}

/* ---- the devices' work ---------------------------------------------------- */

/* execute's answer for a work request held by a queue pair that
 * retransmits it over a dead link: it goes back to wait. */
#define WC_RETRANSMIT ((enum ibv_wc_status) - 1)

/* A work request posted and not yet executed. */
struct pending_wr {
	struct fake_qp *q;
	uint64_t wr_id;
	enum ibv_wr_opcode opcode;
	unsigned int send_flags;
	struct ibv_sge sge;
	uint64_t remote_addr;
	uint32_t rkey;
	struct pending_wr *next;
};

/* worker is one device's engine in this process: its work requests in
 * posting order and the thread that runs them. */
struct worker {
	struct pending_wr *head, *tail;
	pthread_cond_t cond;
	int started;
	clockid_t clock;    /* the thread's CPU clock */
	uint64_t next_free; /* rate limit: when the device is free again */
};

static struct worker workers[MAXDEV];

/* nic_nanos is the CPU time of every device thread (mu held). */
static long nic_nanos(void) {
	long v = 0;
	for (int d = 0; d < MAXDEV; d++) {
		struct timespec ts;
		if (workers[d].started && clock_gettime(workers[d].clock, &ts) == 0)
			v += ts.tv_sec * 1000000000L + ts.tv_nsec;
	}
	return v;
}

static void wake_workers(void) {
	pthread_mutex_lock(&mu);
	for (int d = 0; d < MAXDEV; d++)
		if (workers[d].started)
			pthread_cond_broadcast(&workers[d].cond);
	pthread_mutex_unlock(&mu);
}

/* copy_remote moves n bytes between local memory and the memory of pid at
 * remote. It returns 0 or an errno. */
static int copy_remote(int read, void *local, int pid, uint64_t remote, size_t n) {
	if (pid == self_pid) {
		if (read)
			memcpy(local, (void *)(uintptr_t)remote, n);
		else
			memcpy((void *)(uintptr_t)remote, local, n);
		return 0;
	}
	size_t done = 0;
	while (done < n) {
		struct iovec l = {(char *)local + done, n - done};
		struct iovec r = {(void *)(uintptr_t)(remote + done), n - done};
		ssize_t k = read ? process_vm_readv(pid, &l, 1, &r, 1, 0) : process_vm_writev(pid, &l, 1, &r, 1, 0);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			return errno;
		}
		if (k == 0)
			return EFAULT;
		done += (size_t)k;
	}
	return 0;
}

/* execute runs one work request of q (without mu; q->executing counts it,
 * so the queue pair is not destroyed meanwhile). A memory region being
 * deregistered waits for the copy, as ibv_dereg_mr waits for the NIC. */
static enum ibv_wc_status execute(struct fake_qp *q, struct pending_wr *w, int *nic_failed) {
	struct ibv_sge *s = &w->sge;
	fab_lock();
	struct fab_qp *self = &fab->qps[q->slot];
	if (self->state == IBV_QPS_ERR) {
		fab_unlock();
		return IBV_WC_WR_FLUSH_ERR;
	}
	struct fab_mr *lm = mr_by_key(s->lkey, 0);
	if (!lm || lm->proc != me || lm->dev != q->dev || !covers(lm, s->addr, s->length)) {
		fab_unlock();
		return IBV_WC_LOC_PROT_ERR;
	}
	struct fab_qp *peer = qp_by_num(q->dest);
	if (!peer || peer->dest != q->qp.qp_num || peer->state < IBV_QPS_RTR || peer->state == IBV_QPS_ERR ||
	    !proc_alive(peer->proc)) {
		fab_unlock();
		return IBV_WC_RETRY_EXC_ERR; /* nobody answers */
	}
	struct fab_nic *ln = &fab->procs[me].nic[q->dev], *rn = &fab->procs[peer->proc].nic[peer->dev];
	int lf = __atomic_load_n(&ln->failed, __ATOMIC_RELAXED), rf = __atomic_load_n(&rn->failed, __ATOMIC_RELAXED);
	if (lf == NIC_FAIL || rf == NIC_FAIL) {
		fab_unlock();
		*nic_failed = 1;
		return IBV_WC_RETRY_EXC_ERR; /* a dead link */
	}
	if (lf == NIC_DOWN || rf == NIC_DOWN) {
		fab_unlock();
		/* No acknowledgement comes: the queue pair retransmits until its
		 * retry timer runs out. Only this device's thread touches
		 * stuck_until. */
		uint64_t t = now_ns();
		if (!q->stuck_until)
			q->stuck_until = t + q->retry_ns;
		if (t < q->stuck_until)
			return WC_RETRANSMIT;
		q->stuck_until = 0;
		*nic_failed = 1;
		return IBV_WC_RETRY_EXC_ERR;
	}
	q->stuck_until = 0; /* the link came back: the retransmission went through */
	struct fab_mr *rm = mr_by_key(w->rkey, 1);
	int need = w->opcode == IBV_WR_RDMA_READ ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
	if (!rm || rm->proc != peer->proc || rm->dev != peer->dev || !(rm->access & need) ||
	    !covers(rm, w->remote_addr, s->length)) {
		fab_unlock();
		return IBV_WC_REM_ACCESS_ERR;
	}
	struct fab_exec *ex = &fab->procs[me].exec[q->dev];
	ex->lslot = (int)(lm - fab->mrs);
	ex->rslot = (int)(rm - fab->mrs);
	void *local = (void *)(uintptr_t)(lm->backing + (s->addr - lm->iova));
	uint64_t remote = rm->backing + (w->remote_addr - rm->iova);
	int pid = fab->procs[peer->proc].pid;
	uint64_t lr = __atomic_load_n(&ln->rate, __ATOMIC_RELAXED), rr = __atomic_load_n(&rn->rate, __ATOMIC_RELAXED);
	fab_unlock();

	int err = copy_remote(w->opcode == IBV_WR_RDMA_READ, local, pid, remote, s->length);

	fab_lock();
	ex->lslot = ex->rslot = -1;
	fab_unlock();
	if (err)
		return err == EFAULT ? IBV_WC_REM_ACCESS_ERR : IBV_WC_RETRY_EXC_ERR;
	uint64_t rate = lr && rr ? (lr < rr ? lr : rr) : (lr ? lr : rr);
	if (rate) {
		/* The device moves rate bytes a second: it is busy until
		 * next_free, and the completion waits for that. */
		struct worker *wk = &workers[q->dev];
		uint64_t t = now_ns();
		if (wk->next_free < t)
			wk->next_free = t;
		wk->next_free += (uint64_t)s->length * 1000000000ull / rate;
		if (wk->next_free > t) {
			uint64_t d = wk->next_free - t;
			struct timespec ts = {(time_t)(d / 1000000000ull), (long)(d % 1000000000ull)};
			nanosleep(&ts, NULL);
		}
	}
	return IBV_WC_SUCCESS;
}

static void set_qp_state(struct fake_qp *q, enum ibv_qp_state st) {
	q->qp.state = st;
	fab_lock();
	fab->qps[q->slot].state = st;
	fab_unlock();
}

/* finish queues the completion of w with status st: for a signaled work
 * request and for every failed one, never for an unsignaled success. mu
 * held. */
static void finish(struct pending_wr *w, enum ibv_wc_status st) {
	struct fake_qp *q = w->q;
	struct fake_cq *c = (struct fake_cq *)q->qp.send_cq;
	if (st != IBV_WC_SUCCESS && q->qp.state != IBV_QPS_ERR)
		set_qp_state(q, IBV_QPS_ERR);
	q->uncovered++;
	if (st == IBV_WC_SUCCESS && !(w->send_flags & IBV_SEND_SIGNALED))
		return;
	while (c->count == c->cap)
		pthread_cond_wait(&cq_room, &mu); /* an overrun would be the caller's bug */
	int i = (c->head + c->count) % c->cap;
	struct ibv_wc *e = &c->ring[i];
	memset(e, 0, sizeof(*e));
	e->wr_id = w->wr_id;
	e->status = st;
	e->opcode = w->opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE;
	e->byte_len = w->sge.length;
	e->qp_num = q->qp.qp_num;
	c->owner[i] = q;
	c->covers[i] = q->uncovered;
	q->uncovered = 0;
	c->count++;
	stats[ST_CQES]++;
	signal_channel(c);
}

/* next_wr unlinks the next work request of device d to run: the oldest,
 * except that while stalled (the knob, or a peer process that stopped)
 * only those of queue pairs in the error state run (to be flushed; a queue
 * pair's work requests stay in order since they all wait or all flush), and
 * none of a queue pair that retransmits over a dead link runs before its
 * retry timer is up. *held says whether some wait; *until is the earliest
 * end of a retry timer among them (0: none). mu held. */
static struct pending_wr *next_wr(struct worker *wk, int *held, uint64_t *until) {
	struct pending_wr *prev = NULL;
	uint64_t t = now_ns();
	*held = 0;
	*until = 0;
	for (struct pending_wr *w = wk->head; w; prev = w, w = w->next) {
		if (w->q->qp.state != IBV_QPS_ERR && (stalled || proc_stalled(w->q->peer_proc))) {
			*held = 1;
			continue;
		}
		uint64_t stuck = w->q->stuck_until;
		if (w->q->qp.state != IBV_QPS_ERR && stuck && t < stuck) {
			/* Its queue pair retransmits an earlier one: in order. */
			*held = 1;
			if (!*until || stuck < *until)
				*until = stuck;
			continue;
		}
		if (prev)
			prev->next = w->next;
		else
			wk->head = w->next;
		if (wk->tail == w)
			wk->tail = prev;
		return w;
	}
	return NULL;
}

/* run_worker is device d's "NIC": it executes posted work requests in
 * order, forever (the thread ends with the process). */
static void *run_worker(void *arg) {
	struct worker *wk = arg;
	pthread_mutex_lock(&mu);
	for (;;) {
		struct pending_wr *w;
		int held;
		uint64_t until;
		while (!(w = next_wr(wk, &held, &until))) {
			if (held) {
				/* Look again for a peer that came back, or when a retry
				 * timer runs out. */
				uint64_t d = 10 * 1000 * 1000, t = now_ns();
				if (until && until - t < d)
					d = until > t ? until - t : 0;
				struct timespec ts;
				clock_gettime(CLOCK_REALTIME, &ts);
				ts.tv_sec += (time_t)(d / 1000000000ull);
				ts.tv_nsec += (long)(d % 1000000000ull);
				if (ts.tv_nsec >= 1000000000) {
					ts.tv_sec++;
					ts.tv_nsec -= 1000000000;
				}
				pthread_cond_timedwait(&wk->cond, &mu, &ts);
			} else {
				pthread_cond_wait(&wk->cond, &mu);
			}
		}
		struct fake_qp *q = w->q;
		q->executing++;
		pthread_mutex_unlock(&mu);
		int failed_nic = 0;
		enum ibv_wc_status st = execute(q, w, &failed_nic);
		pthread_mutex_lock(&mu);
		if (st == WC_RETRANSMIT) {
			/* Back to the head: the oldest of its queue pair. */
			w->next = wk->head;
			wk->head = w;
			if (!wk->tail)
				wk->tail = w;
			q->executing--;
			pthread_cond_broadcast(&exec_done);
			continue;
		}
		if (failed_nic)
			stats[ST_FAILED_NIC]++;
		finish(w, st);
		q->executing--;
		pthread_cond_broadcast(&exec_done);
	}
	return NULL;
}

/* post_send checks each work request and queues it for its device. A send
 * queue holds max_send work requests until a completion accounts for them;
 * a full one refuses the post (ENOMEM), as a NIC's does. */
static int post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
	struct fake_qp *q = (struct fake_qp *)qp;
	pthread_mutex_lock(&mu);
	stats[ST_POSTS]++;
	struct worker *wk = &workers[q->dev];
	if (!wk->started) {
		pthread_t th;
		pthread_attr_t a;
		pthread_attr_init(&a);
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
		pthread_cond_init(&wk->cond, NULL);
		if (pthread_create(&th, &a, run_worker, wk) != 0)
			abort();
		pthread_attr_destroy(&a);
		if (pthread_getcpuclockid(th, &wk->clock) == 0)
			wk->started = 1;
		else
			abort();
	}
	for (struct ibv_send_wr *w = wr; w; w = w->next) {
		int bad_wr = w->num_sge != 1 || (w->opcode != IBV_WR_RDMA_WRITE && w->opcode != IBV_WR_RDMA_READ) ||
			     (qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_ERR);
		/* A send queue entry is free once its completion was polled, and
		 * the device ran it before: slot i is free when outstanding <
		 * max_send. */
		struct pending_wr *p = bad_wr || q->outstanding == q->max_send ? NULL : &q->slots[q->posted % q->max_send];
		if (!p) {
			*bad = w;
			pthread_cond_signal(&wk->cond);
			pthread_mutex_unlock(&mu);
			return bad_wr ? EINVAL : ENOMEM;
		}
		q->posted++;
		memset(p, 0, sizeof *p);
		p->q = q;
		p->wr_id = w->wr_id;
		p->opcode = w->opcode;
		p->send_flags = w->send_flags;
		p->sge = w->sg_list[0];
		p->remote_addr = w->wr.rdma.remote_addr;
		p->rkey = w->wr.rdma.rkey;
		if (wk->tail)
			wk->tail->next = p;
		else
			wk->head = p;
		wk->tail = p;
		q->outstanding++;
		stats[ST_POSTED]++;
		if (w->send_flags & IBV_SEND_SIGNALED)
			stats[ST_SIGNALED]++;
	}
	pthread_cond_signal(&wk->cond);
	pthread_mutex_unlock(&mu);
	return 0;
}

static int post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
	(void)qp;
	*bad = wr;
	return EOPNOTSUPP;
}

struct ibv_context *ibv_open_device(struct ibv_device *device) {
	attach();
	struct fake_ctx *f = calloc(1, sizeof(*f));
	if (!f) {
		errno = ENOMEM;
		return NULL;
	}
	struct ibv_context *ctx = &f->v.context;
	ctx->device = device;
	ctx->ops.poll_cq = poll_cq;
	ctx->ops.req_notify_cq = req_notify_cq;
	ctx->ops.post_send = post_send;
	ctx->ops.post_recv = post_recv;
	ctx->num_comp_vectors = 1;
	pthread_mutex_lock(&mu);
	if (!compat) {
		ctx->abi_compat = __VERBS_ABI_IS_EXTENDED;
		f->v.sz = sizeof(struct verbs_context);
		f->v.query_port = ext_query_port;
	}
	stats[ST_CONTEXTS]++;
	pthread_mutex_unlock(&mu);
	return ctx;
}

int ibv_close_device(struct ibv_context *ctx) {
	pthread_mutex_lock(&mu);
	stats[ST_CONTEXTS]--;
	pthread_mutex_unlock(&mu);
	free((char *)ctx - offsetof(struct fake_ctx, v.context));
	return 0;
}

/* mr_limit is the devices' max_mr_size: knob 5, else FAKEVERBS_MAX_MR_SIZE
 * (bytes), else unbounded as most providers report. */
static uint64_t mr_limit(void) {
	pthread_mutex_lock(&mu);
	uint64_t v = max_mr;
	pthread_mutex_unlock(&mu);
	if (v)
		return v;
	const char *e = getenv("FAKEVERBS_MAX_MR_SIZE");
	if (e && *e) {
		unsigned long long n = strtoull(e, NULL, 0);
		if (n)
			return n;
	}
	return ~0ULL;
}

int ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *a) {
	(void)ctx;
	memset(a, 0, sizeof(*a));
	strcpy(a->fw_ver, "fake");
	a->max_mr_size = mr_limit();
	a->max_qp = 1 << 16;
	a->max_qp_wr = 4096;
	a->max_sge = 1;
	a->max_cq = 1 << 16;
	a->max_cqe = 1 << 16;
	a->max_mr = 1 << 16;
	a->max_pd = 1 << 16;
	a->max_qp_rd_atom = 16;
	a->max_qp_init_rd_atom = 16;
	a->phys_port_cnt = 1;
	return 0;
}

int ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid) {
	if (port != 1 || index != 0)
		return EINVAL;
	memset(gid, 0, sizeof(*gid));
	gid->raw[0] = 0xfe;
	gid->raw[1] = 0x80;
	gid->raw[14] = (uint8_t)me;
	gid->raw[15] = (uint8_t)(dev_index(ctx) + 1);
	return 0;
}

struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx) {
	struct ibv_pd *pd = calloc(1, sizeof(*pd));
	if (!pd) {
		errno = ENOMEM;
		return NULL;
	}
	pd->context = ctx;
	pthread_mutex_lock(&mu);
	stats[ST_PDS]++;
	pthread_mutex_unlock(&mu);
	return pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd) {
	pthread_mutex_lock(&mu);
	stats[ST_PDS]--;
	pthread_mutex_unlock(&mu);
	free(pd);
	return 0;
}

/* ---- memory registration -------------------------------------------------- */

/* Slot allocation (fabric lock held): the next free slot after the last
 * one taken, or one a dead process left behind. Slot 0 is never used, so
 * no key or queue pair number is 0. */
static int mr_next, qp_next;

static int free_slot(struct fab_mr *tab, int n, int *next) {
	int dead[MAXPROC];
	memset(dead, -1, sizeof dead);
	for (int k = 0; k < n; k++) {
		int i = 1 + (*next + k) % (n - 1);
		struct fab_mr *f = &tab[i];
		if (f->used && f->proc != me) {
			if (dead[f->proc] < 0)
				dead[f->proc] = !proc_alive(f->proc);
			if (!dead[f->proc])
				continue;
		} else if (f->used) {
			continue;
		}
		*next = i;
		return i;
	}
	return -1;
}

static int free_qp_slot(void) {
	int dead[MAXPROC];
	memset(dead, -1, sizeof dead);
	for (int k = 0; k < MAXQP; k++) {
		int i = 1 + (qp_next + k) % (MAXQP - 1);
		struct fab_qp *f = &fab->qps[i];
		if (f->used && f->proc != me) {
			if (dead[f->proc] < 0)
				dead[f->proc] = !proc_alive(f->proc);
			if (!dead[f->proc])
				continue;
		} else if (f->used) {
			continue;
		}
		qp_next = i;
		return i;
	}
	return -1;
}

/* reg registers [iova, iova+length) whose bytes are at backing in this
 * process (iova itself for host memory). */
static struct ibv_mr *reg(struct ibv_pd *pd, uint64_t iova, size_t length, unsigned int access, uint64_t backing,
			  void *map, size_t maplen, int stat) {
	if (length > mr_limit()) {
		errno = EINVAL; /* above the device's max_mr_size */
		return NULL;
	}
	struct fake_mr *m = calloc(1, sizeof(*m));
	if (!m) {
		errno = ENOMEM;
		return NULL;
	}
	fab_lock();
	int slot = free_slot(fab->mrs, MAXMR, &mr_next);
	if (slot < 0) {
		fab_unlock();
		free(m);
		errno = ENOMEM;
		return NULL;
	}
	uint32_t gen = (++fab->gen_mr) & ((1u << (31 - MR_BITS)) - 1);
	if (gen == 0)
		gen = ++fab->gen_mr & ((1u << (31 - MR_BITS)) - 1);
	struct fab_mr *f = &fab->mrs[slot];
	memset(f, 0, sizeof *f);
	f->lkey = gen << MR_BITS | (uint32_t)slot;
	f->rkey = f->lkey | 0x80000000u;
	f->proc = me;
	f->dev = dev_index(pd->context);
	f->access = (int)access;
	f->iova = iova;
	f->length = length;
	f->backing = backing;
	f->used = f->live = 1;
	fab_unlock();
	m->mr.context = pd->context;
	m->mr.pd = pd;
	m->mr.addr = (void *)(uintptr_t)iova;
	m->mr.length = length;
	m->mr.lkey = f->lkey;
	m->mr.rkey = f->rkey;
	m->slot = slot;
	m->map = map;
	m->maplen = maplen;
	pthread_mutex_lock(&mu);
	stats[ST_MRS]++;
	stats[ST_REGS]++;
	if (stat >= 0)
		stats[stat]++;
	pthread_mutex_unlock(&mu);
	return &m->mr;
}

static int bad_access(unsigned int access) {
	return access & IBV_ACCESS_REMOTE_WRITE && !(access & IBV_ACCESS_LOCAL_WRITE);
}

static int knob_off(const char *name, int *knob) {
	pthread_mutex_lock(&mu);
	int off = *knob;
	pthread_mutex_unlock(&mu);
	const char *v = getenv(name);
	return off || (v && strcmp(v, "0") == 0);
}

/* host_mr registers memory at addr: host memory the process can read, or
 * the fake CUDA driver's device memory (a PROT_NONE mapping of a shared
 * memory object), which it maps as nvidia-peermem pins a GPU's pages.
 * Anything else is EFAULT, as for memory a NIC cannot pin. */
static struct ibv_mr *host_mr(struct ibv_pd *pd, void *addr, size_t length, unsigned int access, int iova2) {
	uint64_t a = (uint64_t)(uintptr_t)addr, end = a + length;
	FILE *f = fopen("/proc/self/maps", "re");
	if (!f) {
		errno = EFAULT;
		return NULL;
	}
	char line[4096];
	uint64_t at = a;
	int device = 0;
	char dpath[4096] = "";
	uint64_t dstart = 0, doff = 0;
	while (at < end && fgets(line, sizeof line, f)) {
		unsigned long long s, e, off;
		char perms[8], path[4096] = "";
		if (sscanf(line, "%llx-%llx %7s %llx %*s %*s %4095[^\n]", &s, &e, perms, &off, path) < 4)
			continue;
		if (e <= at || s > at)
			continue;
		if (perms[0] == 'r') {
			at = e;
			continue;
		}
		/* Without access: the fake driver's device memory or nothing. */
		char *p = path;
		while (*p == ' ')
			p++;
		if (at == a && e >= end && strncmp(p, "/dev/shm/fakecuda-", 18) == 0) {
			device = 1;
			snprintf(dpath, sizeof dpath, "%s", p);
			dstart = s;
			doff = off;
			at = end;
		}
		break;
	}
	fclose(f);
	if (at < end) {
		errno = EFAULT;
		return NULL;
	}
	if (!device)
		return reg(pd, a, length, access, a, NULL, 0, iova2 ? ST_IOVA2 : -1);
	if (knob_off("FAKEVERBS_PEERMEM", &no_peermem)) {
		errno = EFAULT; /* no peer-memory module: the NIC cannot pin GPU pages */
		return NULL;
	}
	int fd = open(dpath, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		errno = EFAULT;
		return NULL;
	}
	long pg = sysconf(_SC_PAGESIZE);
	uint64_t foff = doff + (a - dstart), base = foff & ~(uint64_t)(pg - 1);
	size_t maplen = (size_t)(foff - base + length);
	void *map = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)base);
	close(fd);
	if (map == MAP_FAILED) {
		errno = EFAULT;
		return NULL;
	}
	struct ibv_mr *mr = reg(pd, a, length, access, (uint64_t)(uintptr_t)map + (foff - base), map, maplen, ST_PEERMEM);
	if (!mr)
		munmap(map, maplen);
	return mr;
}

struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access) {
	if (access & IBV_ACCESS_RELAXED_ORDERING) {
		errno = EINVAL; /* optional flags need ibv_reg_mr_iova2 */
		return NULL;
	}
	if (!addr || !length || bad_access((unsigned int)access)) {
		errno = EINVAL;
		return NULL;
	}
	return host_mr(pd, addr, length, (unsigned int)access, 0);
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access) {
	if (!addr || !length || bad_access(access) || iova != (uint64_t)(uintptr_t)addr) {
		errno = EINVAL;
		return NULL;
	}
	return host_mr(pd, addr, length, access, 1);
}

/* ibv_reg_dmabuf_mr maps length bytes at offset of the dma-buf fd and
 * serves [iova, iova+length) from there. */
struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access) {
	if (knob_off("FAKEVERBS_DMABUF", &no_dmabuf)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (!length || bad_access((unsigned int)access) || fd < 0) {
		errno = EINVAL;
		return NULL;
	}
	long pg = sysconf(_SC_PAGESIZE);
	uint64_t base = offset & ~(uint64_t)(pg - 1);
	size_t maplen = (size_t)(offset - base + length);
	void *map = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)base);
	if (map == MAP_FAILED) {
		errno = EINVAL;
		return NULL;
	}
	struct ibv_mr *mr = reg(pd, iova, length, (unsigned int)access, (uint64_t)(uintptr_t)map + (offset - base), map,
				maplen, ST_DMABUF);
	if (!mr)
		munmap(map, maplen);
	return mr;
}

/* ibv_dereg_mr stops the keys at once and returns when no device of any
 * process is copying through the region. */
int ibv_dereg_mr(struct ibv_mr *mr) {
	struct fake_mr *m = (struct fake_mr *)mr;
	fab_lock();
	struct fab_mr *f = &fab->mrs[m->slot];
	if (!f->used || f->lkey != mr->lkey || f->proc != me) {
		fab_unlock();
		return EINVAL;
	}
	f->live = 0;
	while (exec_refs(m->slot)) {
		fab_unlock();
		struct timespec ts = {0, 20000};
		nanosleep(&ts, NULL);
		fab_lock();
	}
	f->used = 0;
	fab_unlock();
	if (m->map)
		munmap(m->map, m->maplen);
	pthread_mutex_lock(&mu);
	stats[ST_MRS]--;
	pthread_mutex_unlock(&mu);
	free(m);
	return 0;
}

/* ---- completion channels and queues --------------------------------------- */

struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *ctx) {
	struct fake_ch *ch = calloc(1, sizeof(*ch));
	int fds[2];
	if (!ch || pipe2(fds, O_CLOEXEC) != 0) {
		free(ch);
		errno = ENOMEM;
		return NULL;
	}
	ch->ch.context = ctx;
	ch->ch.fd = fds[0];
	ch->wfd = fds[1];
	pthread_mutex_lock(&mu);
	stats[ST_CHANNELS]++;
	pthread_mutex_unlock(&mu);
	return &ch->ch;
}

int ibv_destroy_comp_channel(struct ibv_comp_channel *channel) {
	struct fake_ch *ch = (struct fake_ch *)channel;
	close(ch->ch.fd);
	close(ch->wfd);
	pthread_mutex_lock(&mu);
	stats[ST_CHANNELS]--;
	pthread_mutex_unlock(&mu);
	free(ch);
	return 0;
}

struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context, struct ibv_comp_channel *channel,
			     int comp_vector) {
	if (cqe <= 0 || comp_vector != 0) {
		errno = EINVAL;
		return NULL;
	}
	struct fake_cq *c = calloc(1, sizeof(*c));
	if (c) {
		c->ring = calloc((size_t)cqe, sizeof(*c->ring));
		c->owner = calloc((size_t)cqe, sizeof(*c->owner));
		c->covers = calloc((size_t)cqe, sizeof(*c->covers));
	}
	if (!c || !c->ring || !c->owner || !c->covers) {
		if (c) {
			free(c->ring);
			free(c->owner);
			free(c->covers);
		}
		free(c);
		errno = ENOMEM;
		return NULL;
	}
	c->cap = cqe;
	c->cq.context = ctx;
	c->cq.channel = channel;
	c->cq.cq_context = cq_context;
	c->cq.cqe = cqe;
	if (channel)
		((struct fake_ch *)channel)->cq = c;
	pthread_mutex_lock(&mu);
	stats[ST_CQS]++;
	pthread_mutex_unlock(&mu);
	return &c->cq;
}

int ibv_destroy_cq(struct ibv_cq *cq) {
	struct fake_cq *c = (struct fake_cq *)cq;
	pthread_mutex_lock(&mu);
	for (struct fake_qp *q = qps; q; q = q->next)
		if (q->qp.send_cq == cq) {
			pthread_mutex_unlock(&mu);
			return EBUSY;
		}
	stats[ST_CQS]--;
	pthread_mutex_unlock(&mu);
	free(c->ring);
	free(c->owner);
	free(c->covers);
	free(c);
	return 0;
}

int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context) {
	struct fake_ch *ch = (struct fake_ch *)channel;
	char b;
	if (read(ch->ch.fd, &b, 1) != 1)
		return -1; /* errno from read: EAGAIN on a non-blocking fd */
	*cq = &ch->cq->cq;
	*cq_context = ch->cq->cq.cq_context;
	return 0;
}

void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents) { (void)cq, (void)nevents; }

/* ---- queue pairs ------------------------------------------------------------ */

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr) {
	if (attr->qp_type != IBV_QPT_RC || !attr->send_cq || !attr->recv_cq || attr->cap.max_send_wr == 0 ||
	    attr->cap.max_send_wr > 4096 || attr->cap.max_send_sge != 1) {
		errno = EINVAL;
		return NULL;
	}
	struct fake_qp *q = calloc(1, sizeof(*q));
	if (q)
		q->slots = calloc(attr->cap.max_send_wr, sizeof(*q->slots));
	if (!q || !q->slots) {
		if (q)
			free(q);
		errno = ENOMEM;
		return NULL;
	}
	int dev = dev_index(pd->context);
	fab_lock();
	int slot = free_qp_slot();
	if (slot < 0) {
		fab_unlock();
		free(q->slots);
		free(q);
		errno = ENOMEM;
		return NULL;
	}
	uint32_t gen = (++fab->gen_qp) & ((1u << (24 - QP_BITS)) - 1);
	if (gen == 0)
		gen = ++fab->gen_qp & ((1u << (24 - QP_BITS)) - 1);
	struct fab_qp *f = &fab->qps[slot];
	memset(f, 0, sizeof *f);
	f->qpn = gen << QP_BITS | (uint32_t)slot;
	f->proc = me;
	f->dev = dev;
	f->state = IBV_QPS_RESET;
	f->used = 1;
	fab_unlock();
	pthread_mutex_lock(&mu);
	q->qp.context = pd->context;
	q->qp.qp_context = attr->qp_context;
	q->qp.pd = pd;
	q->qp.send_cq = attr->send_cq;
	q->qp.recv_cq = attr->recv_cq;
	q->qp.qp_num = f->qpn;
	q->qp.state = IBV_QPS_RESET;
	q->qp.qp_type = IBV_QPT_RC;
	q->dev = dev;
	q->slot = slot;
	q->peer_proc = me;
	q->max_send = (int)attr->cap.max_send_wr;
	q->next = qps;
	qps = q;
	stats[ST_QPS]++;
	pthread_mutex_unlock(&mu);
	return &q->qp;
}

#define NEED(m) (((mask) & (m)) == (m))

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask) {
	struct fake_qp *q = (struct fake_qp *)qp;
	int rc = 0;
	pthread_mutex_lock(&mu);
	if (!(mask & IBV_QP_STATE)) {
		rc = EINVAL;
	} else if (attr->qp_state == IBV_QPS_ERR) {
		set_qp_state(q, IBV_QPS_ERR);
		pthread_cond_broadcast(&workers[q->dev].cond); /* flush what waits */
	} else if (qp->state == IBV_QPS_RESET && attr->qp_state == IBV_QPS_INIT) {
		if (!NEED(IBV_QP_PORT | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX) || attr->port_num != 1)
			rc = EINVAL;
	} else if (qp->state == IBV_QPS_INIT && attr->qp_state == IBV_QPS_RTR) {
		struct ibv_ah_attr *ah = &attr->ah_attr;
		if (!NEED(IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			  IBV_QP_MIN_RNR_TIMER) ||
		    attr->path_mtu < IBV_MTU_256 || attr->path_mtu > IBV_MTU_4096 || ah->port_num != 1 || !ah->is_global ||
		    ah->grh.dgid.raw[0] != 0xfe || ah->grh.hop_limit == 0 || attr->max_dest_rd_atomic == 0) {
			rc = EINVAL;
		} else {
			q->dest = attr->dest_qp_num;
			fab_lock();
			struct fab_qp *peer = qp_by_num(q->dest);
			q->peer_proc = peer ? peer->proc : -1;
			fab->qps[q->slot].dest = q->dest;
			fab_unlock();
		}
	} else if (qp->state == IBV_QPS_RTR && attr->qp_state == IBV_QPS_RTS) {
		if (!NEED(IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) ||
		    attr->max_rd_atomic == 0 || attr->timeout == 0 || attr->timeout > 31 || attr->retry_cnt > 7)
			rc = EINVAL;
		else /* the local ACK timeout is 4.096 us << timeout, tried retry_cnt + 1 times */
			q->retry_ns = (4096ull << attr->timeout) * (uint64_t)(attr->retry_cnt + 1);
	} else {
		rc = EINVAL;
	}
	if (rc == 0 && attr->qp_state != IBV_QPS_ERR)
		set_qp_state(q, attr->qp_state);
	pthread_mutex_unlock(&mu);
	return rc;
}

int ibv_destroy_qp(struct ibv_qp *qp) {
	pthread_mutex_lock(&mu);
	for (struct fake_qp **p = &qps; *p; p = &(*p)->next)
		if (&(*p)->qp == qp) {
			struct fake_qp *q = *p;
			/* A work request of it on the device finishes first, as
			 * destroying a queue pair waits for the NIC. */
			while (q->executing > 0)
				pthread_cond_wait(&exec_done, &mu);
			*p = q->next;
			/* Work requests of it not yet executed are dropped;
			 * completions of it still queued no longer free
			 * anything. */
			struct worker *wk = &workers[q->dev];
			struct pending_wr **w = &wk->head;
			wk->tail = NULL;
			while (*w) {
				if ((*w)->q == q) {
					*w = (*w)->next;
				} else {
					wk->tail = *w;
					w = &(*w)->next;
				}
			}
			struct fake_cq *c = (struct fake_cq *)qp->send_cq;
			for (int k = 0; k < c->count; k++)
				if (c->owner[(c->head + k) % c->cap] == q)
					c->owner[(c->head + k) % c->cap] = NULL;
			fab_lock();
			fab->qps[q->slot].used = 0;
			fab_unlock();
			stats[ST_QPS]--;
			pthread_mutex_unlock(&mu);
			free(q->slots);
			free(q);
			return 0;
		}
	pthread_mutex_unlock(&mu);
	return EINVAL;
}
