package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/infradev/infradev/harness/envspec"
	"github.com/infradev/infradev/harness/layer"
)

// run executes step i into a new layer file inside tmp.
func (b *builder) step(ctx context.Context, i int, s envspec.Step, tmp string) (layer.Info, error) {
	epoch := time.Unix(0, 0)
	if d := b.env.Layers[0].Debian; d != nil {
		epoch = time.Unix(d.SourceDateEpoch, 0)
	}
	w, err := layer.Create(filepath.Join(tmp, "layer.tar.gz"), layer.Options{Epoch: epoch, Clamp: s.Debian != nil || s.Apt != nil})
	if err != nil {
		return layer.Info{}, err
	}
	switch {
	case s.Debian != nil:
		err = b.debian(ctx, s.Debian, nil, tmp, w)
	case s.Apt != nil:
		err = b.apt(ctx, i, tmp, w)
	case s.Git != nil && s.Git.URL != "":
		err = b.gitURL(ctx, s.Git, tmp, w)
	case s.Git != nil:
		err = b.git(ctx, s, tmp, w)
	case s.Copy != nil:
		err = w.AddTree(s.Source(s.Copy.Source), s.Copy.Dest, nil)
	case s.Run != nil:
		err = b.run(ctx, s.Run, tmp, w)
	case s.Pip != nil:
		err = b.pip(ctx, s, tmp, w)
	}
	if err != nil {
		w.Abort()
		return layer.Info{}, err
	}
	return w.Close()
}

// toolEnv is the environment of the host tools that make layers (mmdebstrap and the package
// scripts it runs): fixed, so that nothing in the caller's environment changes a layer's bytes
// (PYTHONDONTWRITEBYTECODE, for one, changes how Debian byte-compiles Python). PATH and HOME
// say where tools are; proxy settings change where packages come from, not what they are.
func toolEnv(extra ...string) []string {
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "LANG=C.UTF-8"}
	for _, k := range []string{"http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "TMPDIR"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return append(env, extra...)
}

// debian runs mmdebstrap for d plus extra packages; with w set it writes the result as a
// canonical layer, otherwise it leaves the tarball at tmp/rootfs.tar and returns.
func (b *builder) debian(ctx context.Context, d *envspec.Debian, extra []string, tmp string, w *layer.Writer) error {
	out := filepath.Join(tmp, "rootfs.tar")
	args := []string{"--quiet", "--variant=" + d.Variant, "--architectures=" + d.Architecture}
	if inc := append(append([]string{}, d.Include...), extra...); len(inc) > 0 {
		args = append(args, "--include="+strings.Join(inc, ","))
	}
	args = append(args, d.Suite, out)
	if d.Mirror != "" {
		args = append(args, d.Mirror)
	}
	cmd := exec.CommandContext(ctx, "mmdebstrap", args...)
	cmd.Env = toolEnv("SOURCE_DATE_EPOCH=" + strconv.FormatInt(d.SourceDateEpoch, 10))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("mmdebstrap %s: %w\n%s", strings.Join(args, " "), err, tail(stderr.String(), 2000))
	}
	if w == nil {
		return nil
	}
	return layer.Canonicalize(out, w)
}

// apt builds the root filesystem with every package up to step i and writes what it changed
// relative to the filesystem of step i-1.
func (b *builder) apt(ctx context.Context, i int, tmp string, w *layer.Writer) error {
	base := b.env.Layers[0].Debian
	var upTo func(n int) []string
	upTo = func(n int) []string {
		var pkgs []string
		for _, s := range b.env.Layers[1 : n+1] {
			if s.Apt != nil {
				pkgs = append(pkgs, s.Apt.Packages...)
			}
		}
		return pkgs
	}
	parentDir, fullDir := filepath.Join(tmp, "parent"), filepath.Join(tmp, "full")
	for _, d := range []string{parentDir, fullDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	parentTar := filepath.Join(parentDir, "rootfs.tar")
	if prev := upTo(i - 1); len(prev) == 0 {
		// The parent filesystem is the debian layer itself: reuse it rather than rebuild it.
		if err := gunzipTo(b.blobPath(b.done[0].Digest), parentTar); err != nil {
			return fmt.Errorf("reading base layer: %w", err)
		}
	} else if err := b.debian(ctx, base, prev, parentDir, nil); err != nil {
		return err
	}
	if err := b.debian(ctx, base, upTo(i), fullDir, nil); err != nil {
		return err
	}
	return layer.Diff(parentTar, filepath.Join(fullDir, "rootfs.tar"), w)
}

// git writes a repository holding the source tree as one commit whose id depends only on the
// tree, the date, the author and the message. The index (which records inode numbers and
// times) is left out; the runner rebuilds it inside the sandbox.
func (b *builder) git(ctx context.Context, s envspec.Step, tmp string, w *layer.Writer) error {
	g := s.Git
	src := s.Source(g.Source)
	gitDir := filepath.Join(tmp, "git")
	tmpl := filepath.Join(tmp, "template")
	if err := os.Mkdir(tmpl, 0o755); err != nil {
		return err
	}
	name, email, _ := strings.Cut(strings.TrimSuffix(g.Author, ">"), " <")
	env := append(os.Environ(),
		"GIT_DIR="+gitDir, "GIT_WORK_TREE="+src, "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME="+name, "GIT_AUTHOR_EMAIL="+email, "GIT_COMMITTER_NAME="+name, "GIT_COMMITTER_EMAIL="+email,
		"GIT_AUTHOR_DATE="+g.Date, "GIT_COMMITTER_DATE="+g.Date, "TZ=UTC",
	)
	gitRun := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Env = env
		var out, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &stderr
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, stderr.String())
		}
		return out.String(), nil
	}
	steps := [][]string{
		{"init", "-q", "--template=" + tmpl, "--initial-branch=main"},
		{"config", "core.logAllRefUpdates", "false"},
		{"add", "-A", "."},
		{"commit", "-q", "--no-verify", "--no-gpg-sign", "-m", g.Message},
		// init recorded the host's source path as the work tree; the image's repo is its own.
		{"config", "--unset", "core.worktree"},
	}
	for _, a := range steps {
		if _, err := gitRun(a...); err != nil {
			return err
		}
	}
	files, err := gitRun("ls-files", "-s", "-z")
	if err != nil {
		return err
	}
	if err := w.AddParents(g.Dest + "/x"); err != nil {
		return err
	}
	// The work tree: exactly the tracked files, with git's modes.
	for _, rec := range strings.Split(strings.TrimSuffix(files, "\x00"), "\x00") {
		if rec == "" {
			continue
		}
		meta, rel, _ := strings.Cut(rec, "\t")
		mode := strings.Fields(meta)[0]
		if err := addTracked(w, src, g.Dest, rel, mode); err != nil {
			return err
		}
	}
	return w.AddTree(gitDir, path.Join(g.Dest, ".git"), func(rel string) bool { return rel == "index" })
}

func addTracked(w *layer.Writer, src, dest, rel, mode string) error {
	full := filepath.Join(src, filepath.FromSlash(rel))
	name := path.Join(dest, rel)
	if err := w.AddParents(name); err != nil {
		return err
	}
	switch mode {
	case "120000":
		target, err := os.Readlink(full)
		if err != nil {
			return err
		}
		return w.Add(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}, nil)
	case "100644", "100755":
		f, err := os.Open(full)
		if err != nil {
			return err
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		perm := int64(0o644)
		if mode == "100755" {
			perm = 0o755
		}
		return w.Add(&tar.Header{Typeflag: tar.TypeReg, Name: name, Size: fi.Size(), Mode: perm}, f)
	}
	return fmt.Errorf("%s: unsupported git mode %s", rel, mode)
}

func gunzipTo(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	zr, err := gzip.NewReader(in)
	if err != nil {
		return err
	}
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, zr); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
