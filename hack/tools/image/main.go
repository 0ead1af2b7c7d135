// Command image assembles Facet's multi-platform OCI image from directories
// already laid out on disk (hack/image.sh builds them), with
// go-containerregistry: no Docker, no registry, no base image pulled.
//
//	image --name facet.local/facet:0.1.0 --out _output/facet-image.tar \
//	  --layer linux/amd64=DIR --layer linux/amd64=DIR2 --layer linux/arm64=DIR ...
//
// Each --layer becomes one gzip layer of that platform's image, in the order
// given; every file in it is owned by root and dated --created, so the same
// inputs give the same digests. The output is a tar of an OCI image layout
// whose index.json names the image index with io.containerd.image.name, the
// form `ctr -n k8s.io images import` takes.
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(s string) error { *m = append(*m, s); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fl := flag.NewFlagSet("image", flag.ContinueOnError)
	name := fl.String("name", "", "image name, e.g. facet.local/facet:0.1.0")
	out := fl.String("out", "", "output OCI archive (.tar)")
	user := fl.String("user", "65532:65532", "the image's default user")
	created := fl.Int64("created", 0, "creation time, seconds since the epoch (e.g. the commit's time)")
	var layers, labels, env, cmd multi
	fl.Var(&layers, "layer", "PLATFORM=DIR: a layer of that platform's image (repeatable, in order)")
	fl.Var(&labels, "label", "KEY=VALUE: an image label and index annotation (repeatable)")
	fl.Var(&env, "env", "KEY=VALUE: an environment variable of the image (repeatable)")
	fl.Var(&cmd, "cmd", "an argument of the image's default command (repeatable)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if *name == "" || *out == "" || len(layers) == 0 {
		return errors.New("--name, --out and --layer are required")
	}
	when := time.Unix(*created, 0).UTC()
	lbl := map[string]string{}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return fmt.Errorf("--label %q: want KEY=VALUE", l)
		}
		lbl[k] = v
	}

	var platforms []string
	dirs := map[string][]string{}
	for _, l := range layers {
		p, dir, ok := strings.Cut(l, "=")
		if !ok {
			return fmt.Errorf("--layer %q: want PLATFORM=DIR", l)
		}
		if _, seen := dirs[p]; !seen {
			platforms = append(platforms, p)
		}
		dirs[p] = append(dirs[p], dir)
	}

	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range platforms {
		plat, err := v1.ParsePlatform(p)
		if err != nil {
			return err
		}
		img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
		for _, dir := range dirs[p] {
			layer, err := dirLayer(dir, when)
			if err != nil {
				return fmt.Errorf("%s: %w", dir, err)
			}
			if img, err = mutate.Append(img, mutate.Addendum{
				Layer:     layer,
				History:   v1.History{Created: v1.Time{Time: when}, CreatedBy: "hack/image.sh: " + filepath.Base(dir), Comment: "facet hack/tools/image"},
				MediaType: types.OCILayer,
			}); err != nil {
				return err
			}
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return err
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture, cf.Variant = plat.OS, plat.Architecture, plat.Variant
		cf.Created = v1.Time{Time: when}
		cf.Config.User = *user
		cf.Config.WorkingDir = "/"
		cf.Config.Env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
		cf.Config.Cmd = cmd
		cf.Config.Labels = lbl
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			return err
		}
		img = mutate.Annotations(img, lbl).(v1.Image)
		ls, err := img.Layers()
		if err != nil {
			return err
		}
		var size int64
		for _, l := range ls {
			n, err := l.Size()
			if err != nil {
				return err
			}
			size += n
		}
		fmt.Fprintf(os.Stderr, "%s: %d layers, %.1f MiB compressed\n", p, len(ls), float64(size)/(1<<20))
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: plat},
		})
	}
	idx = mutate.Annotations(idx, lbl).(v1.ImageIndex)

	tmp, err := os.MkdirTemp(filepath.Dir(*out), ".image-layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	lp, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return err
	}
	tag := *name
	if i := strings.LastIndex(tag, ":"); i > strings.LastIndex(tag, "/") {
		tag = tag[i+1:]
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":          *name,
		"org.opencontainers.image.ref.name": tag,
	})); err != nil {
		return err
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	if err := tarDir(tmp, *out, when); err != nil {
		return err
	}
	fmt.Printf("%s %s %s\n", *name, digest, *out)
	return nil
}

// dirLayer is a layer holding dir's tree at /, every entry owned by root
// and dated when; modes and symlinks are kept.
func dirLayer(dir string, when time.Time) (v1.Layer, error) {
	var buf bytes.Buffer
	if err := writeTree(&buf, dir, "", when); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// tarDir writes dir's tree (the OCI layout) as the archive out.
func tarDir(dir, out string, when time.Time) error {
	f, err := os.Create(out + ".tmp")
	if err != nil {
		return err
	}
	if err := writeTree(f, dir, "", when); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(out+".tmp", out)
}

// writeTree writes a tar of dir, names sorted, prefixed by prefix.
func writeTree(w io.Writer, dir, prefix string, when time.Time) error {
	tw := tar.NewWriter(w)
	var paths []string
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(paths)
	for _, p := range paths {
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		hdr.Name = prefix + filepath.ToSlash(rel)
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		hdr.ModTime, hdr.AccessTime, hdr.ChangeTime = when, time.Time{}, time.Time{}
		hdr.Format = tar.FormatPAX
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			if err != nil {
				return err
			}
		}
	}
	return tw.Close()
}
