package segment

import (
	"os"
	"strings"

	"github.com/tecache/te/internal/errs"
)

// LocalHostID reads this process's identity: the boot id tells one boot of
// one machine from every other, the pid namespace tells which pids it can
// name.
func LocalHostID() (HostID, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return HostID{}, errs.Wrap(errs.NotSupported, "host", err, "read the boot id")
	}
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return HostID{}, errs.Wrap(errs.NotSupported, "host", err, "read the pid namespace")
	}
	return HostID{BootID: strings.TrimSpace(string(b)), PidNS: ns, Pid: os.Getpid()}, nil
}
