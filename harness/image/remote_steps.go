package image

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/infradev/infradev/harness/envspec"
	"github.com/infradev/infradev/harness/layer"
	"github.com/infradev/infradev/harness/sandbox"
)

// baseImage brings a base image's layers into the layout, unchanged, so their digests stay
// the upstream ones. A base whose manifest is already in the layout is not fetched again.
func (b *builder) baseImage(ctx context.Context, key string, s envspec.Step) ([]BuiltLayer, []v1.Layer, error) {
	ref, err := name.NewDigest(s.Image.Ref)
	if err != nil {
		return nil, nil, fmt.Errorf("image %q: %w", s.Image.Ref, err)
	}
	cached := true
	raw, err := os.ReadFile(blobPath(b.st.Layout(), ref.DigestStr()))
	if err != nil {
		img, err := remote.Image(ref, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain))
		if err != nil {
			return nil, nil, fmt.Errorf("pulling %s: %w", s.Image.Ref, err)
		}
		if err := putLayers(b.st.Layout(), img); err != nil {
			return nil, nil, fmt.Errorf("pulling %s: %w", s.Image.Ref, err)
		}
		cfg, err := img.RawConfigFile()
		if err != nil {
			return nil, nil, err
		}
		if _, err := putBlob(b.st.Layout(), cfg); err != nil {
			return nil, nil, err
		}
		if raw, err = img.RawManifest(); err != nil {
			return nil, nil, err
		}
		if _, err := putBlob(b.st.Layout(), raw); err != nil {
			return nil, nil, err
		}
		cached = false
	}
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, nil, err
	}
	cfgRaw, err := rehash(b.st.Layout(), m.Config.Digest.String())
	if err != nil {
		return nil, nil, err
	}
	cfg, err := v1.ParseConfigFile(bytes.NewReader(cfgRaw))
	if err != nil {
		return nil, nil, err
	}
	if len(cfg.RootFS.DiffIDs) != len(m.Layers) {
		return nil, nil, fmt.Errorf("base %s: %d layers, %d diff ids", s.Image.Ref, len(m.Layers), len(cfg.RootFS.DiffIDs))
	}
	var bls []BuiltLayer
	var ls []v1.Layer
	for i, d := range m.Layers {
		rec := stepRecord{Digest: d.Digest.String(), DiffID: cfg.RootFS.DiffIDs[i].String(), Size: d.Size}
		l, err := b.blobLayer(rec)
		if err != nil {
			return nil, nil, err
		}
		bl := BuiltLayer{Step: fmt.Sprintf("%s[%d]", s.Name, i), Kind: "image", Key: key,
			Digest: rec.Digest, DiffID: rec.DiffID, Size: rec.Size, Cached: cached}
		bls, ls = append(bls, bl), append(ls, l)
		b.done = append(b.done, bl)
	}
	return bls, ls, nil
}

// gitURL puts an upstream repository at a pinned commit into the layer: the commit's files
// and a shallow .git holding exactly that commit, its trees and blobs, in one pack made
// single-threaded, with HEAD detached at the commit and no reflog, so the layer's bytes depend
// only on the commit. The repository comes from the mirror map, or from its URL over the
// network when the map has no entry for it.
func (b *builder) gitURL(ctx context.Context, g *envspec.Git, tmp string, w *layer.Writer) error {
	env := append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0", "LC_ALL=C", "TZ=UTC")
	gitRun := func(stdin io.Reader, args ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Env, cmd.Stdin = env, stdin
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, tail(stderr.String(), 1000))
		}
		return out, nil
	}
	source := ""
	if len(b.mirrors.Candidates(g.URL)) > 0 {
		dir, err := b.mirrors.Resolve(g.URL, g.Commit)
		if err != nil {
			return err
		}
		source = dir
	} else {
		// No mirror: fetch the one commit from the URL into a scratch repository.
		source = filepath.Join(tmp, "fetched")
		if _, err := gitRun(nil, "init", "-q", "--bare", source); err != nil {
			return err
		}
		if _, err := gitRun(nil, "--git-dir", source, "fetch", "-q", "--depth=1", g.URL, g.Commit); err != nil {
			return err
		}
	}
	objects, err := gitRun(nil, "--git-dir", source, "rev-list", "--objects", "--no-walk", g.Commit)
	if err != nil {
		return err
	}
	var ids bytes.Buffer
	for _, line := range strings.Split(strings.TrimSpace(string(objects)), "\n") {
		id, _, _ := strings.Cut(line, " ")
		ids.WriteString(id + "\n")
	}
	pack, err := gitRun(&ids, "--git-dir", source, "-c", "pack.threads=1", "pack-objects", "--threads=1", "--stdout", "-q")
	if err != nil {
		return err
	}
	dir := filepath.Join(tmp, "repo")
	gitDir := filepath.Join(dir, ".git")
	tmpl := filepath.Join(tmp, "template")
	if err := os.MkdirAll(tmpl, 0o755); err != nil {
		return err
	}
	if _, err := gitRun(nil, "init", "-q", "--template="+tmpl, dir); err != nil {
		return err
	}
	if _, err := gitRun(bytes.NewReader(pack), "--git-dir", gitDir, "index-pack", "--stdin"); err != nil {
		return err
	}
	for name, data := range map[string]string{
		"HEAD":    g.Commit + "\n",
		"shallow": g.Commit + "\n",
		"config":  "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\tlogallrefupdates = false\n",
	} {
		if err := os.WriteFile(filepath.Join(gitDir, name), []byte(data), 0o644); err != nil {
			return err
		}
	}
	// The work tree, checked out by git (attributes of the commit itself apply, as in any clone).
	for _, args := range [][]string{{"read-tree", g.Commit}, {"checkout-index", "-a", "-f"}} {
		if _, err := gitRun(nil, append([]string{"--git-dir", gitDir, "--work-tree", dir}, args...)...); err != nil {
			return err
		}
	}
	return w.AddTree(dir, g.Dest, func(rel string) bool {
		return rel == ".git/index" || rel == ".git/FETCH_HEAD" || rel == ".git/logs" || strings.HasPrefix(rel, ".git/logs/")
	})
}

// run executes a command over the stack built so far, with the network, and writes what it
// changed as the layer.
func (b *builder) run(ctx context.Context, r *envspec.Run, tmp string, w *layer.Writer) error {
	var lowers []string
	for _, bl := range b.done {
		dir, err := b.unpack.Layer(blobPath(b.st.Layout(), bl.Digest), bl.Digest, bl.DiffID, lowers)
		if err != nil {
			return err
		}
		lowers = append(lowers, dir)
	}
	ov, err := sandbox.MountOverlay(lowers, filepath.Join(tmp, "root"), 0)
	if err != nil {
		return err
	}
	defer ov.Unmount()
	var env []string
	for k, v := range b.env.Config.Env {
		env = append(env, k+"="+v)
	}
	env = append(env, r.Env...)
	var log bytes.Buffer
	res, err := b.sandbox.Run(ctx, sandbox.Spec{
		Root: ov.Merged, WritableRoot: true, Network: true,
		Args: r.Command, Env: env, Cwd: r.Cwd, Stdout: &log, Stderr: &log,
	})
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("%s exited %d:\n%s", strings.Join(r.Command, " "), res.ExitCode, tail(log.String(), 2000))
	}
	return w.AddUpper(ov.Upper())
}
