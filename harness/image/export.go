package image

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// ArchivesEnv names a folder into which every image written to any store is also saved as a
// docker-archive (DIR/<manifest hex>.tar, tagged infradev/<name>:<first 12 hex>), for
// `docker load` and `podman load`. The test suite sets it to load every image it builds into
// Docker and podman; a pool that runs images under Docker can set it too. An image already
// saved (same manifest digest) is not written again.
const ArchivesEnv = "INFRADEV_DOCKER_ARCHIVES"

var repoName = regexp.MustCompile(`^[a-z0-9]+(?:[._-][a-z0-9]+)*$`)

// exportArchive saves the image digest of the layout at layoutDir into os.Getenv(ArchivesEnv),
// when that is set. The archive appears whole or not at all.
func exportArchive(layoutDir, digest, imageName string) error {
	dir := os.Getenv(ArchivesEnv)
	if dir == "" {
		return nil
	}
	h, err := v1.NewHash(digest)
	if err != nil {
		return err
	}
	dest := filepath.Join(dir, h.Hex+".tar")
	if _, err := os.Stat(dest); err == nil {
		return nil
	}
	repo := "infradev/image"
	if repoName.MatchString(imageName) {
		repo = "infradev/" + imageName
	}
	tag, err := name.NewTag(repo + ":" + h.Hex[:12])
	if err != nil {
		return fmt.Errorf("$%s: %w", ArchivesEnv, err)
	}
	img, err := layout.Path(layoutDir).Image(h)
	if err != nil {
		return fmt.Errorf("$%s: reading %s from %s: %w", ArchivesEnv, digest, layoutDir, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("$%s: %w", ArchivesEnv, err)
	}
	f, err := os.CreateTemp(dir, ".archive-*.tmp")
	if err != nil {
		return fmt.Errorf("$%s: %w", ArchivesEnv, err)
	}
	defer os.Remove(f.Name())
	err = tarball.Write(tag, img, f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), dest)
	}
	if err != nil {
		return fmt.Errorf("$%s: saving %s as a docker-archive: %w", ArchivesEnv, imageName, err)
	}
	return nil
}
