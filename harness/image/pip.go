package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/infradev/infradev/harness/atomicfile"
	"github.com/infradev/infradev/harness/envspec"
	"github.com/infradev/infradev/harness/layer"
	"github.com/infradev/infradev/harness/sandbox"
)

// A pip step runs in three kinds of sandbox over the stack built so far, all with the image's
// own Python and pip:
//
//   - lock (network): `pip install --dry-run --report` resolves the requirements against the
//     venv as the layers below leave it, so what an earlier pip step installed is not locked
//     again; the report gives every archive's name, version, URL and sha256;
//   - download (network): archives missing from the wheel store are fetched with
//     `pip download --no-deps --require-hashes` and kept in the store by digest;
//   - install (no network): the venv is created if missing, the lock installed from the staged
//     archives only (`--no-index --require-hashes --no-deps --no-compile`), then the files it
//     added are byte-compiled with hash-based pycs. The layer is what the install changed.
//
// Paths inside the sandbox all lie under /tmp, a tmpfs of the sandbox's own: the mount points
// never reach the overlay's upper directory, so never the layer.
const (
	sbDir      = "/tmp/infradev"
	sbWheels   = sbDir + "/wheels"  // staged archives (install), read-only
	sbIn       = sbDir + "/in"      // requirement files and lists, read-only
	sbOut      = sbDir + "/out"     // the report, the downloads
	sbScratch  = sbDir + "/scratch" // TMPDIR: pip unpacks and builds here, on the host's disk
	sbCABundle = sbDir + "/ca.pem"  // the host's CA bundle (network sandboxes)
	sysPath    = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	zipEpoch   = 315532800 // 1980-01-01: the earliest time a zip (a wheel built from source) holds
)

// compileScript byte-compiles the files listed in argv[1] with hash-based pycs that are never
// checked against their sources (the image is read-only), so neither the build time nor the
// files' times reach the pycs. Files that are not Python 3 (templates, Python 2 leftovers) stay
// uncompiled, as pip leaves them.
const compileScript = `import concurrent.futures, os, py_compile, sys
def build(f):
    try:
        py_compile.compile(f, doraise=True, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        return 0
    except py_compile.PyCompileError:
        return 1
with open(sys.argv[1], encoding="utf-8", errors="surrogateescape") as fh:
    files = [f for f in fh.read().split("\n") if f]
with concurrent.futures.ProcessPoolExecutor() as ex:
    failed = sum(ex.map(build, files, chunksize=64))
print("compiled %d files, %d left as source (not Python 3)" % (len(files) - failed, failed))
`

// pip builds a pip step: archives from the wheel store (downloaded first where missing), then
// an install without network, whose changes are the layer.
func (b *builder) pip(ctx context.Context, s envspec.Step, tmp string, w *layer.Writer) error {
	l, _, err := ReadPipLock(s)
	if err != nil {
		return err
	}
	stage := filepath.Join(tmp, "wheels")
	if err := os.Mkdir(stage, 0o755); err != nil {
		return err
	}
	if err := b.stageArchives(ctx, s, l, tmp, stage); err != nil {
		return err
	}
	ov, err := b.overlay(tmp)
	if err != nil {
		return err
	}
	defer ov.Unmount()
	scratch := filepath.Join(tmp, "scratch")
	in := filepath.Join(tmp, "in")
	for _, d := range []string{scratch, in} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	var wheels, sdists []string
	for _, p := range l.Packages {
		if p.Wheel() {
			wheels = append(wheels, p.requirement())
		} else {
			sdists = append(sdists, p.requirement())
		}
	}
	for name, lines := range map[string][]string{"wheels.txt": wheels, "sdists.txt": sdists} {
		if err := os.WriteFile(filepath.Join(in, name), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			return err
		}
	}
	spec := sandbox.Spec{
		Root: ov.Merged, WritableRoot: true,
		Env: b.pipEnv(),
		Mounts: []sandbox.Mount{
			{Source: stage, Dest: sbWheels, ReadOnly: true},
			{Source: in, Dest: sbIn, ReadOnly: true},
			{Source: scratch, Dest: sbScratch},
		},
	}
	venv := s.Pip.Venv
	py := path.Join(venv, "bin", "python")
	if _, err := os.Lstat(filepath.Join(ov.Merged, venv, "pyvenv.cfg")); errors.Is(err, fs.ErrNotExist) {
		if _, err := b.inSandbox(ctx, spec, "creating the venv", "python3", "-m", "venv", "--without-pip", venv); err != nil {
			return fmt.Errorf("pip step %s: %w", s.Name, err)
		}
	}
	install := []string{"python3", "-m", "pip", "--python", py, "install", "--no-index", "--find-links", sbWheels,
		"--require-hashes", "--no-deps", "--no-compile", "--no-cache-dir", "--progress-bar", "off"}
	start := time.Now()
	if len(wheels) > 0 {
		if _, err := b.inSandbox(ctx, spec, "installing the locked wheels", append(install, "-r", sbIn+"/wheels.txt")...); err != nil {
			return fmt.Errorf("pip step %s: %w", s.Name, err)
		}
	}
	if len(sdists) > 0 {
		// Source distributions are built with what the venv has (setuptools from the lock or
		// a step below): no build isolation, which would fetch build tools from the index.
		if _, err := b.inSandbox(ctx, spec, "building and installing the locked source distributions",
			append(install, "--no-build-isolation", "-r", sbIn+"/sdists.txt")...); err != nil {
			return fmt.Errorf("pip step %s: %w (a source distribution is built without the network: its build backend, e.g. setuptools, must be in the venv)", s.Name, err)
		}
	}
	fmt.Fprintf(b.log, "  pip %s: installed %d packages in %s\n", s.Name, len(l.Packages), time.Since(start).Round(time.Second))
	n, err := compileList(ov.Upper(), venv, filepath.Join(in, "compile.txt"))
	if err != nil {
		return err
	}
	if n > 0 {
		start = time.Now()
		out, err := b.inSandbox(ctx, spec, "byte-compiling", py, "-c", compileScript, sbIn+"/compile.txt")
		if err != nil {
			return fmt.Errorf("pip step %s: %w", s.Name, err)
		}
		fmt.Fprintf(b.log, "  pip %s: %s in %s\n", s.Name, strings.TrimSpace(lastLine(out)), time.Since(start).Round(time.Second))
	}
	return w.AddUpper(ov.Upper())
}

// compileList writes the absolute image paths of the Python sources the install added or
// changed under venv/lib (the upper directory holds exactly those) to list, one a line, and
// returns how many there are. Sources of the layers below keep the pycs they have.
func compileList(upper, venv, list string) (int, error) {
	root := filepath.Join(upper, venv, "lib")
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && p == root {
			return filepath.SkipAll
		}
		if err != nil {
			return err
		}
		if d.Type().IsRegular() && strings.HasSuffix(p, ".py") && !strings.ContainsAny(p, "\n\r") {
			rel, _ := filepath.Rel(upper, p)
			files = append(files, "/"+filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	sort.Strings(files)
	return len(files), os.WriteFile(list, []byte(strings.Join(files, "\n")+"\n"), 0o644)
}

// stageArchives puts every archive of the lock into stage (hard links into the wheel store),
// downloading the ones the store lacks, and checks each against its hash.
func (b *builder) stageArchives(ctx context.Context, s envspec.Step, l *PipLock, tmp, stage string) error {
	var missing []PipPackage
	for _, p := range l.Packages {
		ok, err := b.haveArchive(p)
		if err != nil {
			return err
		}
		if !ok {
			missing = append(missing, p)
		}
	}
	fmt.Fprintf(b.log, "  pip %s: %d archives locked, %d in the wheel store, %d to download\n",
		s.Name, len(l.Packages), len(l.Packages)-len(missing), len(missing))
	if len(missing) > 0 {
		if err := b.download(ctx, s, missing, tmp); err != nil {
			return err
		}
	}
	for _, p := range l.Packages {
		if err := linkOrCopy(b.archivePath(p), filepath.Join(stage, p.File)); err != nil {
			return err
		}
	}
	return nil
}

// archivePath is where the wheel store keeps an archive: by digest, under its own file name
// (pip needs the name to tell a wheel's version and tags).
func (b *builder) archivePath(p PipPackage) string {
	return filepath.Join(b.wheels, "sha256", p.SHA256, p.File)
}

// haveArchive reports whether the store holds p's archive with the right bytes; a corrupt copy
// is removed, to be downloaded again.
func (b *builder) haveArchive(p PipPackage) (bool, error) {
	f, err := os.Open(b.archivePath(p))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	h := sha256.New()
	_, err = io.Copy(h, f)
	f.Close()
	if err != nil {
		return false, err
	}
	if hex.EncodeToString(h.Sum(nil)) != p.SHA256 {
		fmt.Fprintf(b.log, "  wheel store: %s is corrupt; fetching it again\n", b.archivePath(p))
		return false, os.Remove(b.archivePath(p))
	}
	return true, nil
}

// download fetches missing archives into the wheel store: pip download in a sandbox with the
// network over the stack so far, each archive checked against the lock by pip and again here.
func (b *builder) download(ctx context.Context, s envspec.Step, missing []PipPackage, tmp string) error {
	ov, err := b.overlay(filepath.Join(tmp, "download"))
	if err != nil {
		return err
	}
	defer ov.Unmount()
	dl, in, scratch := filepath.Join(tmp, "download-out"), filepath.Join(tmp, "download-in"), filepath.Join(tmp, "download-scratch")
	for _, d := range []string{dl, in, scratch} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	var lines []string
	for _, p := range missing {
		lines = append(lines, p.requirement())
	}
	if err := os.WriteFile(filepath.Join(in, "missing.txt"), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	env, mounts := hostNetwork()
	spec := sandbox.Spec{
		Root: ov.Merged, WritableRoot: true, Network: true,
		Env: append(b.pipEnv(), env...),
		Mounts: append(mounts,
			sandbox.Mount{Source: in, Dest: sbIn, ReadOnly: true},
			sandbox.Mount{Source: dl, Dest: sbOut},
			sandbox.Mount{Source: scratch, Dest: sbScratch}),
	}
	start := time.Now()
	if _, err := b.inSandbox(ctx, spec, "downloading "+names(missing), "python3", "-m", "pip", "download", "--no-deps",
		"--require-hashes", "--no-cache-dir", "--progress-bar", "off", "--dest", sbOut, "-r", sbIn+"/missing.txt"); err != nil {
		return fmt.Errorf("pip step %s: %w", s.Name, err)
	}
	// Every downloaded file must be one the lock asked for, with its bytes.
	want := map[string]PipPackage{}
	for _, p := range missing {
		want[p.SHA256] = p
	}
	entries, err := os.ReadDir(dl)
	if err != nil {
		return err
	}
	var total int64
	for _, e := range entries {
		src := filepath.Join(dl, e.Name())
		sum, size, err := fileSHA256(src)
		if err != nil {
			return err
		}
		p, ok := want[sum]
		if !ok {
			return fmt.Errorf("pip step %s: pip downloaded %s (sha256:%s), which the lock does not pin", s.Name, e.Name(), sum)
		}
		dst := b.archivePath(p)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := os.Rename(src, dst); err != nil {
			return fmt.Errorf("wheel store: %w", err)
		}
		delete(want, sum)
		total += size
	}
	if len(want) > 0 {
		var left []PipPackage
		for _, p := range want {
			left = append(left, p)
		}
		return fmt.Errorf("pip step %s: pip download did not bring %s", s.Name, names(left))
	}
	fmt.Fprintf(b.log, "  pip %s: downloaded %d archives, %s, in %s\n", s.Name, len(missing), sizeText(total), time.Since(start).Round(time.Second))
	return nil
}

// overlay mounts the stack built so far under a scratch layer kept in dir/root.
func (b *builder) overlay(dir string) (*sandbox.Overlay, error) {
	var lowers []string
	for _, bl := range b.done {
		d, err := b.unpack.Layer(blobPath(b.st.Layout(), bl.Digest), bl.Digest, bl.DiffID, lowers)
		if err != nil {
			return nil, err
		}
		lowers = append(lowers, d)
	}
	return sandbox.MountOverlay(lowers, filepath.Join(dir, "root"), 0)
}

// inSandbox runs args in the sandbox spec describes and returns its output; a non-zero exit
// is an error that says what was being done and ends with the output's tail.
func (b *builder) inSandbox(ctx context.Context, spec sandbox.Spec, what string, args ...string) (string, error) {
	var out bytes.Buffer
	spec.Args, spec.Stdout, spec.Stderr = args, &out, &out
	res, err := b.sandbox.Run(ctx, spec)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	if res.ExitCode != 0 {
		hint := ""
		if o := out.String(); strings.Contains(o, "No module named pip") || strings.Contains(o, "ensurepip is not available") || strings.Contains(o, "No module named venv") {
			hint = "\n(a pip step needs python3, python3-pip and python3-venv in the layers below it)"
		}
		return out.String(), fmt.Errorf("%s: %s exited %d:\n%s%s", what, strings.Join(args[:min(len(args), 4)], " "), res.ExitCode, tail(out.String(), 3000), hint)
	}
	return out.String(), nil
}

// pipEnv is the fixed environment of every pip sandbox: nothing of the caller's or the
// image's environment reaches pip or the pycs (PYTHONPATH, for one, would). Python writes no
// pycs of its own (those of pip itself would land in the layer); the step compiles exactly
// the venv's new sources.
func (b *builder) pipEnv() []string {
	epoch := int64(zipEpoch)
	if d := b.env.Layers[0].Debian; d != nil && d.SourceDateEpoch > epoch {
		epoch = d.SourceDateEpoch
	}
	return []string{
		"PATH=" + sysPath, "HOME=/tmp", "LANG=C.UTF-8", "TMPDIR=" + sbScratch,
		"PYTHONDONTWRITEBYTECODE=1", "PYTHONHASHSEED=0", "SOURCE_DATE_EPOCH=" + strconv.FormatInt(epoch, 10),
		"PIP_DISABLE_PIP_VERSION_CHECK=1", "PIP_NO_INPUT=1", "PIP_ROOT_USER_ACTION=ignore",
	}
}

// hostPipSkip are PIP_* variables not passed into the network sandboxes: they name files on
// the host (PIP_FIND_LINKS names local archive directories, which would make the lock depend
// on what lies there) or say where to install, which the step decides. The CA bundle is
// mounted and named separately.
var hostPipSkip = map[string]bool{
	"PIP_FIND_LINKS": true, "PIP_CONFIG_FILE": true, "PIP_CERT": true, "PIP_CLIENT_CERT": true,
	"PIP_TARGET": true, "PIP_PREFIX": true, "PIP_ROOT": true, "PIP_USER": true, "PIP_SRC": true,
	"PIP_CACHE_DIR": true, "PIP_LOG": true, "PIP_REQUIRE_VIRTUALENV": true, "PIP_PYTHON": true,
}

// hostNetwork is the host's package-index configuration for the sandboxes that reach the
// network: its PIP_* variables (except hostPipSkip), its proxy settings, the CA bundle it
// trusts (PIP_CERT, else SSL_CERT_FILE, else REQUESTS_CA_BUNDLE, else Debian's bundle),
// mounted read-only and named by PIP_CERT, SSL_CERT_FILE and REQUESTS_CA_BUNDLE, and its
// /etc/resolv.conf. It says where archives come from, never what they are: the lock's hashes
// do that. pip configuration files on the host are not read.
func hostNetwork() (env []string, mounts []sandbox.Mount) {
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "PIP_") && !hostPipSkip[k]:
			env = append(env, kv)
		case strings.EqualFold(k, "http_proxy"), strings.EqualFold(k, "https_proxy"), strings.EqualFold(k, "no_proxy"), strings.EqualFold(k, "all_proxy"):
			env = append(env, kv)
		}
	}
	for _, k := range []string{"PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", ""} {
		f := os.Getenv(k)
		if k == "" {
			f = "/etc/ssl/certs/ca-certificates.crt"
		}
		if fi, err := os.Stat(f); f != "" && err == nil && fi.Mode().IsRegular() {
			mounts = append(mounts, sandbox.Mount{Source: f, Dest: sbCABundle, ReadOnly: true})
			env = append(env, "PIP_CERT="+sbCABundle, "SSL_CERT_FILE="+sbCABundle, "REQUESTS_CA_BUNDLE="+sbCABundle)
			break
		}
	}
	if fi, err := os.Stat("/etc/resolv.conf"); err == nil && fi.Mode().IsRegular() {
		mounts = append(mounts, sandbox.Mount{Source: "/etc/resolv.conf", Dest: "/etc/resolv.conf", ReadOnly: true})
	}
	sort.Strings(env)
	return env, mounts
}

// LockPip resolves the requirements of every pip step that env's own env.yaml defines (not
// those of the environments it stacks on, whose locks must exist) and writes their lock
// files. Resolution runs in the build sandbox with the network, with the image's own Python
// and pip, over the layers below the step, which are built first (or found cached).
func LockPip(ctx context.Context, env *envspec.Env, st Store, o Options) ([]*PipLock, error) {
	b, unlock, err := openBuilder(env, st, o)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var locks []*PipLock
	for i, s := range env.Layers {
		if s.Pip == nil || filepath.Clean(s.Dir) != filepath.Clean(env.Dir) {
			continue
		}
		b.done = nil
		if _, _, err := b.layers(ctx, i, nil); err != nil {
			return nil, err
		}
		l, err := b.resolve(ctx, s)
		if err != nil {
			return nil, fmt.Errorf("environment %s, pip step %s: %w", env.Name, s.Name, err)
		}
		l.Env = env.Name
		if err := WritePipLock(s.LockPath(), l); err != nil {
			return nil, err
		}
		locks = append(locks, l)
	}
	return locks, nil
}

// pipReport is the part of pip's installation report (--report) a lock needs.
type pipReport struct {
	Install []struct {
		DownloadInfo struct {
			URL         string `json:"url"`
			ArchiveInfo *struct {
				Hash   string            `json:"hash"`
				Hashes map[string]string `json:"hashes"`
			} `json:"archive_info"`
		} `json:"download_info"`
		IsDirect bool `json:"is_direct"`
		Metadata struct {
			Name    string `json:"name"`
			Version string `json:"version"`
		} `json:"metadata"`
	} `json:"install"`
}

// resolve runs pip's resolver over the layers built so far (b.done) and returns the lock.
func (b *builder) resolve(ctx context.Context, s envspec.Step) (*PipLock, error) {
	tmp, err := os.MkdirTemp(b.st.tmpDir(), "lock-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	ov, err := b.overlay(tmp)
	if err != nil {
		return nil, err
	}
	defer ov.Unmount()
	in, out, scratch := filepath.Join(tmp, "in"), filepath.Join(tmp, "out"), filepath.Join(tmp, "scratch")
	for _, d := range []string{in, out, scratch} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(in, "requirements.txt"), []byte(strings.Join(s.Pip.Requirements, "\n")+"\n"), 0o644); err != nil {
		return nil, err
	}
	env, mounts := hostNetwork()
	spec := sandbox.Spec{
		Root: ov.Merged, WritableRoot: true, Network: true,
		Env: append(b.pipEnv(), env...),
		Mounts: append(mounts,
			sandbox.Mount{Source: in, Dest: sbIn, ReadOnly: true},
			sandbox.Mount{Source: out, Dest: sbOut},
			sandbox.Mount{Source: scratch, Dest: sbScratch}),
	}
	venv := s.Pip.Venv
	py := path.Join(venv, "bin", "python")
	// Resolve against the venv the step installs into, as the layers below leave it: a
	// missing venv is made in this throwaway root first (the system Python's packages must
	// not count as installed).
	if _, err := os.Lstat(filepath.Join(ov.Merged, venv, "pyvenv.cfg")); errors.Is(err, fs.ErrNotExist) {
		if _, err := b.inSandbox(ctx, spec, "creating the venv", "python3", "-m", "venv", "--without-pip", venv); err != nil {
			return nil, err
		}
	}
	start := time.Now()
	if _, err := b.inSandbox(ctx, spec, "resolving "+strings.Join(s.Pip.Requirements, " "), "python3", "-m", "pip", "--python", py,
		"install", "--dry-run", "--no-cache-dir", "--progress-bar", "off", "--report", sbOut+"/report.json", "-r", sbIn+"/requirements.txt"); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(out, "report.json"))
	if err != nil {
		return nil, fmt.Errorf("pip wrote no report: %w", err)
	}
	l, err := lockFromReport(s, data)
	if err != nil {
		return nil, err
	}
	if err := b.checkBuildable(ctx, spec, py, l); err != nil {
		return nil, err
	}
	fmt.Fprintf(b.log, "  pip %s: resolved %d packages in %s\n", s.Name, len(l.Packages), time.Since(start).Round(time.Second))
	return l, nil
}

// lockFromReport turns pip's installation report into a lock: one archive per package,
// by name, version, file name and sha256.
func lockFromReport(s envspec.Step, data []byte) (*PipLock, error) {
	var r pipReport
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("reading pip's report: %w", err)
	}
	l := &PipLock{Step: s.Name, Venv: s.Pip.Venv, Requirements: s.Pip.Requirements}
	for _, it := range r.Install {
		name := normName(it.Metadata.Name)
		ai := it.DownloadInfo.ArchiveInfo
		switch {
		case it.IsDirect:
			return nil, fmt.Errorf("%s comes from a direct reference (%s): a lock pins index packages only; require it by name and version", name, it.DownloadInfo.URL)
		case ai == nil:
			return nil, fmt.Errorf("%s==%s is not an archive (%s)", name, it.Metadata.Version, it.DownloadInfo.URL)
		}
		sum := ai.Hashes["sha256"]
		if h, ok := strings.CutPrefix(ai.Hash, "sha256="); sum == "" && ok {
			sum = h
		}
		u, err := url.Parse(it.DownloadInfo.URL)
		if err != nil || len(sum) != 64 {
			return nil, fmt.Errorf("%s==%s: the index gave no sha256 for %s", name, it.Metadata.Version, it.DownloadInfo.URL)
		}
		l.Packages = append(l.Packages, PipPackage{Name: name, Version: it.Metadata.Version, SHA256: sum, File: path.Base(u.Path)})
	}
	sort.Slice(l.Packages, func(i, j int) bool { return l.Packages[i].Name < l.Packages[j].Name })
	// The lock must read back as it was made.
	if _, err := ParsePipLock("lock", l.Format()); err != nil {
		return nil, err
	}
	return l, nil
}

// checkBuildable refuses a lock with source distributions that cannot be built offline: the
// install builds them without isolation, with the setuptools the venv has by then.
func (b *builder) checkBuildable(ctx context.Context, spec sandbox.Spec, py string, l *PipLock) error {
	var sdists []PipPackage
	inLock := false
	for _, p := range l.Packages {
		if !p.Wheel() {
			sdists = append(sdists, p)
		}
		inLock = inLock || p.Name == "setuptools"
	}
	if len(sdists) == 0 || inLock {
		return nil
	}
	spec.Args, spec.Stdout, spec.Stderr = []string{py, "-c", "import setuptools"}, nil, nil
	res, err := b.sandbox.Run(ctx, spec)
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("%s: only a source distribution is available, and building it without the network needs setuptools in the venv: add setuptools to the requirements", names(sdists))
	}
	return nil
}

func names(ps []PipPackage) string {
	var s []string
	for _, p := range ps {
		s = append(s, p.String())
	}
	sort.Strings(s)
	if len(s) > 8 {
		return strings.Join(s[:8], ", ") + fmt.Sprintf(" and %d more", len(s)-8)
	}
	return strings.Join(s, ", ")
}

func fileSHA256(p string) (string, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	return hex.EncodeToString(h.Sum(nil)), n, err
}

// linkOrCopy hard-links src to dst, or copies it where the two are on different filesystems.
func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	return atomicfile.Copy(src, dst)
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
