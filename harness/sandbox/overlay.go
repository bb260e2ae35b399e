package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Overlay is a mounted overlayfs: read-only lower layers with a writable scratch layer above.
// Nothing is copied: the lower directories are used where they are.
type Overlay struct {
	// Merged is the mounted root filesystem.
	Merged string
	dir    string
	tmpfs  bool
}

// MountOverlay mounts lowers (bottom layer first) under a new scratch layer kept in dir, which
// must be empty or absent. With scratchBytes > 0 the scratch layer lives on a tmpfs of that
// size, so nothing run inside can fill the host's disk. Call Unmount when done.
func MountOverlay(lowers []string, dir string, scratchBytes int64) (*Overlay, error) {
	if len(lowers) == 0 {
		return nil, fmt.Errorf("overlay needs at least one lower layer")
	}
	o := &Overlay{Merged: filepath.Join(dir, "merged"), dir: dir}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("overlay: %w", err)
	}
	if scratchBytes > 0 {
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("size=%d,mode=0755", scratchBytes)); err != nil {
			return nil, fmt.Errorf("overlay: scratch tmpfs: %w", err)
		}
		o.tmpfs = true
	}
	for _, d := range []string{"upper", "work", "merged"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("overlay: %w", err)
		}
	}
	// overlayfs lists lowerdir top first.
	top := make([]string, len(lowers))
	for i, l := range lowers {
		if strings.ContainsAny(l, ":,") {
			return nil, fmt.Errorf("overlay: layer path %q contains ':' or ','", l)
		}
		top[len(lowers)-1-i] = l
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", strings.Join(top, ":"),
		filepath.Join(dir, "upper"), filepath.Join(dir, "work"))
	if err := unix.Mount("overlay", o.Merged, "overlay", 0, opts); err != nil {
		o.Unmount()
		return nil, fmt.Errorf("mounting overlay at %s: %w", o.Merged, err)
	}
	return o, nil
}

// Upper is the scratch layer's directory: everything the runs changed.
func (o *Overlay) Upper() string { return filepath.Join(o.dir, "upper") }

// Unmount unmounts the overlay and removes its scratch layer.
func (o *Overlay) Unmount() error {
	if err := unix.Unmount(o.Merged, unix.MNT_DETACH); err != nil && err != unix.EINVAL {
		return fmt.Errorf("unmounting %s: %w", o.Merged, err)
	}
	if o.tmpfs {
		if err := unix.Unmount(o.dir, unix.MNT_DETACH); err != nil && err != unix.EINVAL {
			return fmt.Errorf("unmounting %s: %w", o.dir, err)
		}
	}
	return os.RemoveAll(o.dir)
}

// MountLayers mounts lowers (bottom layer first) as a read-only overlayfs at dir/merged, with
// no scratch layer: nothing run over it can change it. Unmount removes dir.
func MountLayers(lowers []string, dir string) (*Overlay, error) {
	if len(lowers) < 2 {
		return nil, fmt.Errorf("a read-only overlay needs at least two layers")
	}
	o := &Overlay{Merged: filepath.Join(dir, "merged"), dir: dir}
	if err := os.MkdirAll(o.Merged, 0o755); err != nil {
		return nil, fmt.Errorf("overlay: %w", err)
	}
	top := make([]string, len(lowers))
	for i, l := range lowers {
		if strings.ContainsAny(l, ":,") {
			return nil, fmt.Errorf("overlay: layer path %q contains ':' or ','", l)
		}
		top[len(lowers)-1-i] = l
	}
	if err := unix.Mount("overlay", o.Merged, "overlay", unix.MS_RDONLY, "lowerdir="+strings.Join(top, ":")); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("mounting a read-only overlay at %s: %w", o.Merged, err)
	}
	return o, nil
}
