//go:build !(cgo && linux)

package probe

import "errors"

// Open fails: this build has no cgo, so it cannot dlopen libcuda.so.1.
func Open(path string) (Driver, error) {
	return nil, errors.New("this facetctl was built without cgo (CGO_ENABLED=0): it cannot load " + path)
}
