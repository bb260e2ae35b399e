package image

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/infradev/infradev/harness/atomicfile"
)

// The layout is written here rather than through go-containerregistry's layout package,
// which writes blobs of known digest and index.json in place: a crash there leaves a partial
// file under a final name. Here every file appears whole or not at all.

const layoutMarker = `{"imageLayoutVersion":"1.0.0"}`

// initLayout makes dir an empty OCI image layout unless it already is one.
func initLayout(dir string) error {
	if err := os.MkdirAll(filepath.Join(dir, "blobs", "sha256"), 0o755); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, "oci-layout")); errors.Is(err, fs.ErrNotExist) {
		if err := atomicfile.Write(filepath.Join(dir, "oci-layout"), []byte(layoutMarker)); err != nil {
			return err
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "index.json")); errors.Is(err, fs.ErrNotExist) {
		return writeIndex(dir, &v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex})
	}
	return nil
}

func blobPath(dir, digest string) string {
	return filepath.Join(dir, "blobs", "sha256", hexOf(digest))
}

// putBlob stores data under its digest, atomically; an existing blob is kept.
func putBlob(dir string, data []byte) (string, error) {
	sum := sha256.Sum256(data)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	p := blobPath(dir, digest)
	if fi, err := os.Stat(p); err == nil && fi.Size() == int64(len(data)) {
		return digest, nil
	}
	return digest, atomicfile.Write(p, data)
}

// putBlobFrom streams r into the layout, checking it against digest before it is renamed into
// place. An existing blob of the right size is kept.
func putBlobFrom(dir, digest string, size int64, r io.Reader) error {
	p := blobPath(dir, digest)
	if fi, err := os.Stat(p); err == nil && (size < 0 || fi.Size() == size) {
		return nil
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".blob-*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	h := sha256.New()
	_, err = io.Copy(io.MultiWriter(f, h), r)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != digest {
		return fmt.Errorf("blob %s: received content hashes to %s", digest, got)
	}
	return os.Rename(f.Name(), p)
}

func readIndex(dir string) (*v1.IndexManifest, error) {
	data, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		return nil, err
	}
	return v1.ParseIndexManifest(bytes.NewReader(data))
}

func writeIndex(dir string, idx *v1.IndexManifest) error {
	data, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, "index.json"), append(data, '\n'))
}

// putLayers copies every layer of img into the layout, each checked against its digest.
func putLayers(dir string, img v1.Image) error {
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return err
		}
		size, err := l.Size()
		if err != nil {
			return err
		}
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		err = putBlobFrom(dir, d.String(), size, rc)
		rc.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// putImage writes img's config and manifest (its layers must be in the layout already) and
// names it in index.json, replacing any image of the same name. The index is rewritten last,
// so a crash before it leaves the previous index, which references only complete blobs. With
// $INFRADEV_DOCKER_ARCHIVES set, the image is then also saved as a docker-archive.
func putImage(dir string, img v1.Image, name string) (string, error) {
	layers, err := img.Layers()
	if err != nil {
		return "", err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return "", err
		}
		if _, err := os.Stat(blobPath(dir, d.String())); err != nil {
			return "", fmt.Errorf("layer %s is not in the layout", d)
		}
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		return "", err
	}
	if _, err := putBlob(dir, cfg); err != nil {
		return "", err
	}
	raw, err := img.RawManifest()
	if err != nil {
		return "", err
	}
	digest, err := putBlob(dir, raw)
	if err != nil {
		return "", err
	}
	mt, err := img.MediaType()
	if err != nil {
		return "", err
	}
	h, _ := v1.NewHash(digest)
	if err := nameInIndex(dir, v1.Descriptor{MediaType: mt, Size: int64(len(raw)), Digest: h}, name); err != nil {
		return "", err
	}
	return digest, exportArchive(dir, digest, name)
}

// nameInIndex points name at desc in index.json.
func nameInIndex(dir string, desc v1.Descriptor, name string) error {
	idx, err := readIndex(dir)
	if err != nil {
		return err
	}
	kept := idx.Manifests[:0]
	for _, m := range idx.Manifests {
		if m.Annotations[RefAnnotation] != name {
			kept = append(kept, m)
		}
	}
	desc.Annotations = map[string]string{RefAnnotation: name}
	idx.Manifests = append(kept, desc)
	return writeIndex(dir, idx)
}

// Resolve returns the manifest digest the layout names name.
func Resolve(layoutDir, name string) (string, error) {
	idx, err := readIndex(layoutDir)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", layoutDir, err)
	}
	for _, m := range idx.Manifests {
		if m.Annotations[RefAnnotation] == name {
			return m.Digest.String(), nil
		}
	}
	return "", fmt.Errorf("no image named %q in %s", name, layoutDir)
}
