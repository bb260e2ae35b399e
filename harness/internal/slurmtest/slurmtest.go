// Package slurmtest starts a real single-node Slurm cluster for tests: munged, slurmctld and
// slurmd from Debian's packages, on 127.0.0.1, with their state in a temporary folder and two
// fake GPUs as gres (character devices), so jobs asking for GPUs are scheduled as on a GPU
// cluster. It needs root; tests skip (or fail in CI) without slurm-wlm and munge.
package slurmtest

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/infradev/infradev/harness/internal/testenv"
)

// Cluster is a running cluster.
type Cluster struct {
	Dir string
	// Conf is slurm.conf; Env holds SLURM_CONF for the client commands.
	Conf string
	Env  []string
	// JobLog is the job completion log (jobcomp/filetxt): a line per finished job.
	JobLog string
	// Node is the node's name.
	Node string
	t    testing.TB
}

// Start starts a cluster, stopped when the test ends. SlurmdTimeout is short (10 s) so a node
// whose slurmd dies is declared down, and its jobs failed, within a test's patience.
func Start(t testing.TB) *Cluster {
	t.Helper()
	for _, bin := range []string{"slurmctld", "slurmd", "munged", "sbatch", "scontrol"} {
		_, err := exec.LookPath(bin)
		testenv.Require(t, err == nil, "Slurm and munge (Debian's slurm-wlm and munge; tools/setup installs them)")
	}
	testenv.Require(t, os.Geteuid() == 0, "root (slurmd runs jobs as their user)")
	dir, err := os.MkdirTemp("", "slurm-")
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	c := &Cluster{Dir: dir, Conf: filepath.Join(dir, "slurm.conf"), JobLog: filepath.Join(dir, "jobcomp.log"), Node: host, t: t}
	for _, d := range []string{"munge", "state", "spool", "log", "dev"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	key := make([]byte, 1024)
	for i := range key {
		key[i] = byte(i*7 + 13)
	}
	if err := os.WriteFile(filepath.Join(dir, "munge", "munge.key"), key, 0o400); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := unix.Mknod(filepath.Join(dir, "dev", fmt.Sprintf("fakegpu%d", i)), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatal(err)
		}
	}
	sock := filepath.Join(dir, "munge", "munge.socket")
	conf := fmt.Sprintf(`ClusterName=infradev-test
SlurmctldHost=%[1]s(127.0.0.1)
SlurmctldPort=%[4]d
SlurmdPort=%[5]d
AuthType=auth/munge
AuthInfo=socket=%[3]s
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=%[2]s/state
SlurmdSpoolDir=%[2]s/spool
SlurmctldPidFile=%[2]s/slurmctld.pid
SlurmdPidFile=%[2]s/slurmd.pid
SlurmctldLogFile=%[2]s/log/slurmctld.log
SlurmdLogFile=%[2]s/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=512
GresTypes=gpu
JobCompType=jobcomp/filetxt
JobCompLoc=%[2]s/jobcomp.log
SlurmdTimeout=10
JobRequeue=0
MinJobAge=300
ReturnToService=2
MpiDefault=none
NodeName=%[1]s NodeAddr=127.0.0.1 CPUs=%[6]d RealMemory=16000 Gres=gpu:fake:2 State=UNKNOWN
PartitionName=main Nodes=%[1]s Default=YES MaxTime=INFINITE State=UP
`, host, dir, sock, freePort(t), freePort(t), runtime.NumCPU())
	if err := os.WriteFile(c.Conf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	gres := fmt.Sprintf("AutoDetect=off\nNodeName=%s Name=gpu Type=fake File=%s/dev/fakegpu[0-1]\n", host, dir)
	if err := os.WriteFile(filepath.Join(dir, "gres.conf"), []byte(gres), 0o644); err != nil {
		t.Fatal(err)
	}
	c.Env = []string{"SLURM_CONF=" + c.Conf}
	t.Cleanup(c.stop)
	c.run("munged", "--socket", sock, "--key-file", filepath.Join(dir, "munge", "munge.key"),
		"--pid-file", filepath.Join(dir, "munge", "munged.pid"), "--log-file", filepath.Join(dir, "log", "munged.log"),
		"--seed-file", filepath.Join(dir, "munge", "munge.seed"), "--force")
	c.run("slurmctld", "-f", c.Conf)
	c.StartSlurmd()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, _ := c.Output("sinfo", "-h", "-o", "%T")
		if s := strings.TrimSpace(out); s == "idle" || s == "mixed" {
			return c
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "log", "slurmctld.log"))
			t.Fatalf("the cluster did not come up (sinfo: %q)\n%s", out, tail(string(log), 3000))
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// StartSlurmd starts the node daemon (again, after KillSlurmd).
func (c *Cluster) StartSlurmd() { c.run("slurmd", "-f", c.Conf) }

// KillNode kills the node daemon and every job step daemon, as a node that fails loses them,
// and marks the node down at once, as a health check would (the controller alone takes
// SlurmdTimeout, longer on a loaded machine): its running jobs end NODE_FAIL.
func (c *Cluster) KillNode() {
	c.KillSlurmd()
	_ = exec.Command("pkill", "-KILL", "-x", "slurmstepd").Run()
	_, _ = c.Output("scontrol", "update", "NodeName="+c.Node, "State=DOWN", "Reason=lost")
}

// RestoreNode starts the node daemon again and returns the node to service.
func (c *Cluster) RestoreNode() {
	c.StartSlurmd()
	_, _ = c.Output("scontrol", "update", "NodeName="+c.Node, "State=RESUME")
}

// KillSlurmd kills the node daemon.
func (c *Cluster) KillSlurmd() {
	if pid, err := os.ReadFile(filepath.Join(c.Dir, "slurmd.pid")); err == nil {
		var p int
		fmt.Sscan(strings.TrimSpace(string(pid)), &p)
		if p > 0 {
			_ = unix.Kill(p, unix.SIGKILL)
		}
	}
}

// Output runs a Slurm client command against the cluster.
func (c *Cluster) Output(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), c.Env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (c *Cluster) run(name string, args ...string) {
	c.t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), c.Env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		c.t.Fatalf("%s: %v\n%s", name, err, out.String())
	}
}

func (c *Cluster) stop() {
	_, _ = c.Output("scancel", "--full", "--user=root")
	_ = exec.Command("pkill", "-KILL", "-x", "slurmstepd").Run()
	for _, pidFile := range []string{"slurmd.pid", "slurmctld.pid", "munge/munged.pid"} {
		if pid, err := os.ReadFile(filepath.Join(c.Dir, pidFile)); err == nil {
			var p int
			fmt.Sscan(strings.TrimSpace(string(pid)), &p)
			if p > 0 {
				_ = unix.Kill(p, unix.SIGTERM)
			}
		}
	}
	time.Sleep(300 * time.Millisecond)
	os.RemoveAll(c.Dir)
}

// freePort is a loopback port nothing listens on now (a cluster started after another one in
// the same process must not wait for the first one's ports).
func freePort(t testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
