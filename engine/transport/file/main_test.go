package file_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv("TE_FILE_CHILD") != "" {
		// A storage node for a test in the parent process.
		os.Exit(m.Run())
	}
	goleak.VerifyTestMain(m)
}
