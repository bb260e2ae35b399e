package sandbox

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

const ownerFile = "owner"

// writeOwner records which process runs a bundle, so a later Sweep can tell orphans.
func writeOwner(bundle string) error {
	return os.WriteFile(filepath.Join(bundle, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o600)
}

// OwnerAlive reports whether the process recorded in dir/owner still runs.
func OwnerAlive(dir string) bool {
	data, err := os.ReadFile(filepath.Join(dir, ownerFile))
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return false
	}
	return syscall.Kill(pid, 0) != syscall.ESRCH
}

// WriteOwner records the current process as the owner of dir (see OwnerAlive).
func WriteOwner(dir string) error { return writeOwner(dir) }

// Sweep kills and deletes containers whose owning process died (e.g. an evaluation killed with
// SIGKILL, whose runtime children outlive it) and returns how many it removed.
func (r *Runc) Sweep() int {
	bin := r.Binary
	if bin == "" {
		bin = "runc"
	}
	root := filepath.Join(r.StateDir, "runc")
	out, err := exec.Command(bin, "--root", root, "list", "--format", "json").Output()
	if err != nil {
		return 0
	}
	var list []struct {
		ID     string `json:"id"`
		Bundle string `json:"bundle"`
	}
	if json.Unmarshal(out, &list) != nil {
		return 0
	}
	n := 0
	for _, c := range list {
		if OwnerAlive(c.Bundle) {
			continue
		}
		_ = exec.Command(bin, "--root", root, "kill", c.ID, "KILL").Run()
		_ = exec.Command(bin, "--root", root, "delete", "-f", c.ID).Run()
		os.RemoveAll(c.Bundle)
		n++
	}
	return n
}
