// transfer.cpp: te's C ABI from C++, behind a small RAII wrapper that turns
// error codes into exceptions. Two engines in one program; prefill pushes KV
// blocks from two threads at once (every te function may be called from any
// thread), and waits for each batch on its eventfd with poll(), as an event
// loop would. Build: examples/c/CMakeLists.txt (find_package(te), te::te).
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <te.h>

namespace te {

// Error is a failed te call: its TE_ERR_* code and te_last_error's message.
struct Error : std::runtime_error {
    int code;
    Error(const char *what, int rc) : std::runtime_error(std::string(what) + ": " + last()), code(rc) {}
    static std::string last() {
        char buf[1024];
        te_last_error(buf, sizeof buf);
        return buf;
    }
};

inline void check(int rc, const char *what) {
    if (rc != 0) throw Error(what, rc);
}

class Batch {
  public:
    Batch(te_engine_t e, size_t capacity) { check(te_allocate_batch(e, capacity, &h_), "te_allocate_batch"); }
    ~Batch() { te_free_batch(h_); }
    Batch(const Batch &) = delete;
    Batch &operator=(const Batch &) = delete;
    void submit(const std::vector<te_request_t> &reqs) { check(te_submit(h_, reqs.data(), reqs.size()), "te_submit"); }
    // wait_fd blocks in poll() on the batch's eventfd, then reads the outcome.
    te_batch_status_t wait_fd(int timeout_ms) {
        int32_t fd;
        check(te_batch_fd(h_, &fd), "te_batch_fd");
        pollfd p{fd, POLLIN, 0};
        if (poll(&p, 1, timeout_ms) != 1) throw std::runtime_error("batch did not finish in time");
        uint64_t v;
        if (read(fd, &v, sizeof v) != sizeof v) throw std::runtime_error("reading the eventfd");
        te_batch_status_t st;
        check(te_wait(h_, 0, &st), "te_wait"); // finished: returns the outcome at once
        return st;
    }

  private:
    te_batch_t h_ = 0;
};

class Engine {
  public:
    explicit Engine(const te_config_t &cfg) { check(te_create(&cfg, &h_), "te_create"); }
    ~Engine() { te_destroy(h_); }
    Engine(const Engine &) = delete;
    Engine &operator=(const Engine &) = delete;
    te_engine_t handle() const { return h_; }
    std::string name() const {
        char buf[256];
        check(te_segment_name(h_, buf, sizeof buf), "te_segment_name");
        return buf;
    }
    void reg(void *p, size_t n) { check(te_register(h_, p, n, "cpu", 1), "te_register"); }
    te_segment_t open(const std::string &name) {
        te_segment_t s;
        check(te_open_segment(h_, name.c_str(), &s), "te_open_segment");
        return s;
    }

  private:
    te_engine_t h_ = 0;
};

}  // namespace te

int main() {
    constexpr size_t kBlock = 256 << 10, kBlocks = 16;
    try {
        te_config_t cfg = TE_CONFIG_INIT;
        cfg.listen_addr = "127.0.0.1:0";
        te::Engine prefill(cfg), decode(cfg);
        size_t n = kBlock * kBlocks;
        auto *src = static_cast<unsigned char *>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
        auto *dst = static_cast<unsigned char *>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
        if (src == MAP_FAILED || dst == MAP_FAILED) return 1;
        for (size_t i = 0; i < n; i++) src[i] = static_cast<unsigned char>(i * 7 + i / kBlock);
        prefill.reg(src, n);
        decode.reg(dst, n);
        te_segment_t seg = prefill.open(decode.name());

        // Two threads, each pushing half of the blocks in its own batch.
        std::vector<std::thread> threads;
        std::vector<uint64_t> moved(2);
        for (int t = 0; t < 2; t++) {
            threads.emplace_back([&, t] {
                std::vector<te_request_t> reqs;
                for (size_t b = t * kBlocks / 2; b < (t + 1) * kBlocks / 2; b++)
                    reqs.push_back({TE_WRITE, 0, src + b * kBlock, seg, reinterpret_cast<uint64_t>(dst + b * kBlock), kBlock});
                te::Batch batch(prefill.handle(), reqs.size());
                batch.submit(reqs);
                moved[t] = batch.wait_fd(30000).transferred;
            });
        }
        for (auto &th : threads) th.join();
        bool ok = moved[0] + moved[1] == n && std::memcmp(src, dst, n) == 0;
        std::printf("prefill: %llu bytes from two threads; decode's copy %s\n",
                    static_cast<unsigned long long>(moved[0] + moved[1]), ok ? "matches" : "DIFFERS");
        te::check(te_close_segment(seg), "te_close_segment");
        munmap(src, n);
        munmap(dst, n);
        std::puts(ok ? "transfer_cpp: ok" : "transfer_cpp: FAILED");
        return ok ? 0 : 1;
    } catch (const te::Error &e) {
        std::fprintf(stderr, "transfer_cpp: %s (code %d)\n", e.what(), e.code);
        return 1;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "transfer_cpp: %s\n", e.what());
        return 1;
    }
}
