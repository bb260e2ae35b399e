package image

import (
	"context"
	"fmt"

	"github.com/gofrs/flock"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"path/filepath"
)

// Push uploads the image the store's layout names name to ref (e.g. registry/repo:tag) and
// returns its manifest digest, which the registry keeps unchanged.
func Push(ctx context.Context, st Store, imageName, ref string) (string, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", fmt.Errorf("reference %q: %w", ref, err)
	}
	digest, err := Resolve(st.Layout(), imageName)
	if err != nil {
		return "", err
	}
	p, err := layout.FromPath(st.Layout())
	if err != nil {
		return "", err
	}
	h, _ := v1.NewHash(digest)
	img, err := p.Image(h)
	if err != nil {
		return "", err
	}
	if err := remote.Write(r, img, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return "", fmt.Errorf("pushing %s to %s: %w", imageName, ref, err)
	}
	return digest, nil
}

// Pull downloads ref into the store's layout, names it imageName, and returns its manifest
// digest. Every blob is checked against its digest before it is renamed into the layout.
func Pull(ctx context.Context, st Store, ref, imageName string) (string, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", fmt.Errorf("reference %q: %w", ref, err)
	}
	img, err := remote.Image(r, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain))
	if err != nil {
		return "", fmt.Errorf("pulling %s: %w", ref, err)
	}
	if err := initLayout(st.Layout()); err != nil {
		return "", err
	}
	lock := flock.New(filepath.Join(st.Dir, "lock"))
	if err := lock.Lock(); err != nil {
		return "", err
	}
	defer lock.Unlock()
	if err := putLayers(st.Layout(), img); err != nil {
		return "", fmt.Errorf("pulling %s: %w", ref, err)
	}
	digest, err := putImage(st.Layout(), img, imageName)
	if err != nil {
		return "", fmt.Errorf("pulling %s: %w", ref, err)
	}
	if d, ok := r.(name.Digest); ok && d.DigestStr() != digest {
		return "", fmt.Errorf("pulling %s: got manifest %s", ref, digest)
	}
	return digest, nil
}
