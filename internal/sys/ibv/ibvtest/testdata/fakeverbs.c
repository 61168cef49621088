/*
 * A software libibverbs for tests: the entry points te's ibv package binds,
 * with the real rdma-core structs (compiled against verbs.h), and a fabric
 * inside the library that connects every queue pair of every context of
 * the process. RDMA READ and WRITE are checked as a NIC checks them (lkey on
 * the local device, rkey on the device of the connected remote queue pair,
 * bounds, access flags, queue pair state) and done with memcpy by a thread
 * of the library, after ibv_post_send has returned, as a NIC does them;
 * completions go to the send CQ and wake its completion channel when armed.
 *
 * It is test data: compiled at test time by package ibvtest and loaded
 * instead of libibverbs.so.1 (ibv.Open, rdma.library).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

#define NDEV 2

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct ibv_device devs[NDEV];
static int ndevices = NDEV;
static int compat;       /* contexts without the extended query_port */
static int stalled;      /* the far side does not answer: nothing executes */
static long stats[16];   /* see fake_verbs_stat */
static uint32_t next_key = 0x100, next_qpn = 0x40;

enum { ST_MRS, ST_QPS, ST_CQS, ST_IOVA2, ST_POSTED, ST_CONTEXTS, ST_CHANNELS, ST_PDS, ST_POSTS, ST_SIGNALED, ST_CQES };

/* fake_verbs_stat returns a counter: live MRs, QPs, CQs, registrations
 * through ibv_reg_mr_iova2, work requests posted, open contexts, channels,
 * PDs, ibv_post_send calls, signaled work requests posted, completions
 * generated. */
long fake_verbs_stat(int what) {
	pthread_mutex_lock(&mu);
	long v = what >= 0 && what < 16 ? stats[what] : -1;
	pthread_mutex_unlock(&mu);
	return v;
}

static pthread_cond_t wq_cond = PTHREAD_COND_INITIALIZER; /* work to do */

/* fake_verbs_set sets a knob: 0 = number of devices, 1 = compat contexts,
 * 2 = stalled (work requests wait, as for a peer that stopped answering;
 * a queue pair moved to the error state still flushes its own at once). */
void fake_verbs_set(int what, long val) {
	pthread_mutex_lock(&mu);
	if (what == 0)
		ndevices = val < 0 ? 0 : val > NDEV ? NDEV : (int)val;
	if (what == 1)
		compat = val != 0;
	if (what == 2)
		stalled = val != 0;
	pthread_cond_broadcast(&wq_cond);
	pthread_mutex_unlock(&mu);
}

static int dev_index(struct ibv_context *ctx) { return (int)(ctx->device - devs); }

struct ibv_device **ibv_get_device_list(int *num) {
	pthread_mutex_lock(&mu);
	int n = ndevices;
	pthread_mutex_unlock(&mu);
	struct ibv_device **l = calloc(n + 1, sizeof(*l));
	if (!l) {
		errno = ENOMEM;
		return NULL;
	}
	for (int i = 0; i < n; i++) {
		snprintf(devs[i].name, sizeof(devs[i].name), "fake%d", i);
		l[i] = &devs[i];
	}
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
	a->lid = (uint16_t)(lid_base + dev_index(ctx) + 1);
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
	uint32_t dest;
	int max_send;
	int outstanding; /* send queue entries in use */
	int uncovered;   /* of them, not yet accounted for by a completion */
	struct fake_qp *next;
};

struct fake_mr {
	struct ibv_mr mr;
	int dev, access;
	struct fake_mr *next;
};

static struct fake_qp *qps;
static pthread_cond_t cq_room = PTHREAD_COND_INITIALIZER; /* a poll freed CQ entries */
static struct fake_mr *mrs;

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

static struct fake_qp *find_qp(uint32_t num) {
	for (struct fake_qp *q = qps; q; q = q->next)
		if (q->qp.qp_num == num)
			return q;
	return NULL;
}

static struct fake_mr *find_key(uint32_t key, int rkey) {
	for (struct fake_mr *m = mrs; m; m = m->next)
		if ((rkey ? m->mr.rkey : m->mr.lkey) == key)
			return m;
	return NULL;
}

static int covers(struct fake_mr *m, uint64_t addr, uint32_t n) {
	uint64_t a = (uint64_t)(uintptr_t)m->mr.addr;
	return addr >= a && addr + n >= addr && addr + n <= a + m->mr.length;
}

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

static struct pending_wr *wq_head, *wq_tail; /* in posting order */
static int worker_started;

/* execute runs one work request; called with mu held (so a deregistration
 * waits for a copy in progress, as ibv_dereg_mr waits for the NIC). */
static enum ibv_wc_status execute(struct fake_qp *q, struct pending_wr *w) {
	if (q->qp.state == IBV_QPS_ERR)
		return IBV_WC_WR_FLUSH_ERR;
	struct ibv_sge *s = &w->sge;
	struct fake_mr *lm = find_key(s->lkey, 0);
	if (!lm || lm->dev != q->dev || !covers(lm, s->addr, s->length))
		return IBV_WC_LOC_PROT_ERR;
	struct fake_qp *peer = find_qp(q->dest);
	if (!peer || peer->dest != q->qp.qp_num || peer->qp.state < IBV_QPS_RTR || peer->qp.state == IBV_QPS_ERR)
		return IBV_WC_RETRY_EXC_ERR; /* nobody answers */
	struct fake_mr *rm = find_key(w->rkey, 1);
	int need = w->opcode == IBV_WR_RDMA_READ ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
	if (!rm || rm->dev != peer->dev || !(rm->access & need) || !covers(rm, w->remote_addr, s->length))
		return IBV_WC_REM_ACCESS_ERR;
	void *local = (void *)(uintptr_t)s->addr, *remote = (void *)(uintptr_t)w->remote_addr;
	if (w->opcode == IBV_WR_RDMA_READ)
		memcpy(local, remote, s->length);
	else
		memcpy(remote, local, s->length);
	return IBV_WC_SUCCESS;
}

/* complete_wr executes w and queues its completion: for a signaled work
 * request and for every failed one, never for an unsignaled success. A
 * queue pair in the error state flushes what reaches it. Called with mu
 * held. */
static void complete_wr(struct pending_wr *w) {
	struct fake_qp *q = w->q;
	struct fake_cq *c = (struct fake_cq *)q->qp.send_cq;
	enum ibv_wc_status st = execute(q, w);
	if (st != IBV_WC_SUCCESS)
		q->qp.state = IBV_QPS_ERR;
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

/* next_wr unlinks the next work request to run: the oldest, or while
 * stalled the oldest of a queue pair in the error state (to be flushed; a
 * queue pair's work requests stay in order since they all wait or all
 * flush). Called with mu held. */
static struct pending_wr *next_wr(void) {
	struct pending_wr *prev = NULL;
	for (struct pending_wr *w = wq_head; w; prev = w, w = w->next) {
		if (stalled && w->q->qp.state != IBV_QPS_ERR)
			continue;
		if (prev)
			prev->next = w->next;
		else
			wq_head = w->next;
		if (wq_tail == w)
			wq_tail = prev;
		return w;
	}
	return NULL;
}

/* run_worker is the library's "NIC": it executes posted work requests in
 * order, forever (the thread ends with the process). */
static void *run_worker(void *arg) {
	(void)arg;
	pthread_mutex_lock(&mu);
	for (;;) {
		struct pending_wr *w;
		while (!(w = next_wr()))
			pthread_cond_wait(&wq_cond, &mu);
		complete_wr(w);
		free(w);
	}
	return NULL;
}

/* post_send checks each work request and queues it for the worker. A send
 * queue holds max_send work requests until a completion accounts for them;
 * a full one refuses the post (ENOMEM), as a NIC's does. */
static int post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
	struct fake_qp *q = (struct fake_qp *)qp;
	pthread_mutex_lock(&mu);
	stats[ST_POSTS]++;
	if (!worker_started) {
		pthread_t th;
		pthread_attr_t a;
		pthread_attr_init(&a);
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&th, &a, run_worker, NULL) != 0)
			abort();
		pthread_attr_destroy(&a);
		worker_started = 1;
	}
	for (struct ibv_send_wr *w = wr; w; w = w->next) {
		int bad_wr = w->num_sge != 1 || (w->opcode != IBV_WR_RDMA_WRITE && w->opcode != IBV_WR_RDMA_READ) ||
			     (qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_ERR);
		struct pending_wr *p = bad_wr || q->outstanding == q->max_send ? NULL : calloc(1, sizeof(*p));
		if (!p) {
			*bad = w;
			pthread_mutex_unlock(&mu);
			return bad_wr ? EINVAL : ENOMEM;
		}
		p->q = q;
		p->wr_id = w->wr_id;
		p->opcode = w->opcode;
		p->send_flags = w->send_flags;
		p->sge = w->sg_list[0];
		p->remote_addr = w->wr.rdma.remote_addr;
		p->rkey = w->wr.rdma.rkey;
		if (wq_tail)
			wq_tail->next = p;
		else
			wq_head = p;
		wq_tail = p;
		q->outstanding++;
		stats[ST_POSTED]++;
		if (w->send_flags & IBV_SEND_SIGNALED)
			stats[ST_SIGNALED]++;
	}
	pthread_cond_signal(&wq_cond);
	pthread_mutex_unlock(&mu);
	return 0;
}

static int post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
	(void)qp;
	*bad = wr;
	return EOPNOTSUPP;
}

struct ibv_context *ibv_open_device(struct ibv_device *device) {
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

int ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *a) {
	(void)ctx;
	memset(a, 0, sizeof(*a));
	strcpy(a->fw_ver, "fake");
	a->max_mr_size = ~0ULL;
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

static struct ibv_mr *reg(struct ibv_pd *pd, void *addr, size_t length, unsigned int access, int iova2) {
	if (!addr || !length || (access & IBV_ACCESS_REMOTE_WRITE && !(access & IBV_ACCESS_LOCAL_WRITE))) {
		errno = EINVAL;
		return NULL;
	}
	struct fake_mr *m = calloc(1, sizeof(*m));
	if (!m) {
		errno = ENOMEM;
		return NULL;
	}
	pthread_mutex_lock(&mu);
	m->mr.context = pd->context;
	m->mr.pd = pd;
	m->mr.addr = addr;
	m->mr.length = length;
	m->mr.lkey = next_key;
	m->mr.rkey = next_key | 0x80000000u;
	next_key++;
	m->dev = dev_index(pd->context);
	m->access = (int)access;
	m->next = mrs;
	mrs = m;
	stats[ST_MRS]++;
	if (iova2)
		stats[ST_IOVA2]++;
	pthread_mutex_unlock(&mu);
	return &m->mr;
}

struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access) {
	if (access & IBV_ACCESS_RELAXED_ORDERING) {
		errno = EINVAL; /* optional flags need ibv_reg_mr_iova2 */
		return NULL;
	}
	return reg(pd, addr, length, (unsigned int)access, 0);
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access) {
	if (iova != (uint64_t)(uintptr_t)addr) {
		errno = EINVAL;
		return NULL;
	}
	return reg(pd, addr, length, access, 1);
}

struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access) {
	(void)pd, (void)offset, (void)length, (void)iova, (void)fd, (void)access;
	errno = EOPNOTSUPP;
	return NULL;
}

int ibv_dereg_mr(struct ibv_mr *mr) {
	pthread_mutex_lock(&mu);
	for (struct fake_mr **p = &mrs; *p; p = &(*p)->next)
		if (&(*p)->mr == mr) {
			struct fake_mr *m = *p;
			*p = m->next;
			stats[ST_MRS]--;
			pthread_mutex_unlock(&mu);
			free(m);
			return 0;
		}
	pthread_mutex_unlock(&mu);
	return EINVAL;
}

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

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr) {
	if (attr->qp_type != IBV_QPT_RC || !attr->send_cq || !attr->recv_cq || attr->cap.max_send_wr == 0 ||
	    attr->cap.max_send_wr > 4096 || attr->cap.max_send_sge != 1) {
		errno = EINVAL;
		return NULL;
	}
	struct fake_qp *q = calloc(1, sizeof(*q));
	if (!q) {
		errno = ENOMEM;
		return NULL;
	}
	pthread_mutex_lock(&mu);
	q->qp.context = pd->context;
	q->qp.qp_context = attr->qp_context;
	q->qp.pd = pd;
	q->qp.send_cq = attr->send_cq;
	q->qp.recv_cq = attr->recv_cq;
	q->qp.qp_num = next_qpn++;
	q->qp.state = IBV_QPS_RESET;
	q->qp.qp_type = IBV_QPT_RC;
	q->dev = dev_index(pd->context);
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
		qp->state = IBV_QPS_ERR;
		pthread_cond_broadcast(&wq_cond); /* flush what waits */
	} else if (qp->state == IBV_QPS_RESET && attr->qp_state == IBV_QPS_INIT) {
		if (!NEED(IBV_QP_PORT | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX) || attr->port_num != 1)
			rc = EINVAL;
	} else if (qp->state == IBV_QPS_INIT && attr->qp_state == IBV_QPS_RTR) {
		struct ibv_ah_attr *ah = &attr->ah_attr;
		if (!NEED(IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			  IBV_QP_MIN_RNR_TIMER) ||
		    attr->path_mtu < IBV_MTU_256 || attr->path_mtu > IBV_MTU_4096 || ah->port_num != 1 || !ah->is_global ||
		    ah->grh.dgid.raw[0] != 0xfe || ah->grh.hop_limit == 0 || attr->max_dest_rd_atomic == 0)
			rc = EINVAL;
		else
			q->dest = attr->dest_qp_num;
	} else if (qp->state == IBV_QPS_RTR && attr->qp_state == IBV_QPS_RTS) {
		if (!NEED(IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) ||
		    attr->max_rd_atomic == 0 || attr->timeout == 0)
			rc = EINVAL;
	} else {
		rc = EINVAL;
	}
	if (rc == 0 && attr->qp_state != IBV_QPS_ERR)
		qp->state = attr->qp_state;
	pthread_mutex_unlock(&mu);
	return rc;
}

int ibv_destroy_qp(struct ibv_qp *qp) {
	pthread_mutex_lock(&mu);
	for (struct fake_qp **p = &qps; *p; p = &(*p)->next)
		if (&(*p)->qp == qp) {
			struct fake_qp *q = *p;
			*p = q->next;
			/* Work requests of it not yet executed are dropped;
			 * completions of it still queued no longer free
			 * anything. */
			struct pending_wr **w = &wq_head;
			wq_tail = NULL;
			while (*w) {
				if ((*w)->q == q) {
					struct pending_wr *x = *w;
					*w = x->next;
					free(x);
				} else {
					wq_tail = *w;
					w = &(*w)->next;
				}
			}
			struct fake_cq *c = (struct fake_cq *)qp->send_cq;
			for (int k = 0; k < c->count; k++)
				if (c->owner[(c->head + k) % c->cap] == q)
					c->owner[(c->head + k) % c->cap] = NULL;
			stats[ST_QPS]--;
			pthread_mutex_unlock(&mu);
			free(q);
			return 0;
		}
	pthread_mutex_unlock(&mu);
	return EINVAL;
}
