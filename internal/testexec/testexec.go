package testexec

import (
	"os"
	"os/exec"
)

// Env names the user-mode emulator that runs programs of this
// architecture (empty or unset: they run natively).
const Env = "TE_TEST_EXEC"

// Emulator is the emulator of Env, or "" when programs run natively.
func Emulator() string { return os.Getenv(Env) }

// Command is exec.Command for a program built for this architecture: name
// itself, or the emulator of Env with name as its first argument.
func Command(name string, arg ...string) *exec.Cmd {
	emu := Emulator()
	if emu == "" {
		return exec.Command(name, arg...)
	}
	return exec.Command(emu, append([]string{name}, arg...)...)
}
