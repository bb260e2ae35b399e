package pytestproto

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// rankScript is each rank's command: it reads its nonce from fd 3 and sends, through fd 4, a
// report naming the rank and the variables it was given, then does what ARGS says for it.
const rankScript = `
import os, signal, sys, time
r = int(os.environ["RANK"])
nonce = os.read(3, 256).decode().split("\n")[0]
doc = '<r rank="%s" local="%s" world="%s" addr="%s" port="%s"/>' % (r, os.environ["LOCAL_RANK"],
    os.environ["WORLD_SIZE"], os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"])
os.write(4, (doc + "\n<!-- infradev-report " + nonce + " -->\n").encode())
os.close(4)
act = sys.argv[1].split(",")[r]
if act == "crash":
    os.kill(os.getpid(), signal.SIGSEGV)
if act == "hang":
    time.sleep(600)
sys.exit(int(act))
`

// launch runs launch.py over ranks copies of rankScript and returns the launcher's exit code,
// each rank's verified report and how long it took.
func launch(t *testing.T, acts []string) (int, []string, []error, time.Duration) {
	t.Helper()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "launch.py"), launchScript, 0o644)
	os.WriteFile(filepath.Join(dir, "rank.py"), []byte(rankScript), 0o644)
	var chans []*ReportChannel
	cmd := exec.Command("/usr/bin/python3", append([]string{"-I", filepath.Join(dir, "launch.py"), fmt.Sprint(len(acts)), "--"},
		"/usr/bin/python3", filepath.Join(dir, "rank.py"), strings.Join(acts, ","))...)
	cmd.Env = append(os.Environ(), "INFRADEV_LAUNCH_GRACE=2")
	for range acts {
		ch, err := OpenReportChannel(nil)
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		chans = append(chans, ch)
		cmd.ExtraFiles = append(cmd.ExtraFiles, ch.Files()...)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for _, ch := range chans {
		ch.Close() // the launcher holds them now
	}
	err := cmd.Wait()
	took := time.Since(start)
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	docs, errs := make([]string, len(acts)), make([]error, len(acts))
	for r, ch := range chans {
		d, err := ch.Report()
		docs[r], errs[r] = string(d), err
	}
	return code, docs, errs, took
}

// TestLaunchGivesEachRankItsOwnChannel: rank r's report arrives on rank r's channel, sealed with
// that channel's nonce, and every rank gets the variables torchrun sets, one rendezvous port
// for all.
func TestLaunchGivesEachRankItsOwnChannel(t *testing.T) {
	code, docs, errs, _ := launch(t, []string{"0", "0", "0"})
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	port := ""
	for r := range docs {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		want := fmt.Sprintf(`<r rank="%d" local="%d" world="3" addr="127.0.0.1" port="`, r, r)
		if !strings.HasPrefix(docs[r], want) {
			t.Fatalf("rank %d's channel carried %q", r, docs[r])
		}
		p := strings.SplitN(docs[r], `port="`, 2)[1]
		if port != "" && p != port {
			t.Errorf("ranks were given different ports: %s and %s", port, p)
		}
		port = p
	}
}

func TestLaunchExitStatus(t *testing.T) {
	cases := []struct {
		name string
		acts []string
		want int
		max  time.Duration
	}{
		{"ranks agree", []string{"1", "1"}, 1, time.Minute},
		{"ranks disagree: the highest", []string{"0", "1", "0"}, 1, time.Minute},
		// The hanging rank is killed after the grace period, not left to the phase timeout.
		{"a crash stops the others", []string{"hang", "crash"}, 128 + 11, 30 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, _, errs, took := launch(t, c.acts)
			if code != c.want || took > c.max {
				t.Errorf("exit %d after %s, want %d within %s", code, took, c.want, c.max)
			}
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d's report: %v", r, err)
				}
			}
		})
	}
}
