// Package claimuid checks ResourceClaim UIDs before they become parts of
// file names and CDI device names. The kubelet passes UIDs it got from the
// API server, but the plugin builds host paths from them (checkpoint
// records, CDI specs, HAMi-core cache directories that are removed
// recursively), so a UID is never trusted to be path-safe.
package claimuid

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// MaxLen bounds a UID; Kubernetes UIDs are 36-character UUIDs, and CDI
// device names built from them must stay well inside file name limits.
const MaxLen = 128

// Validate accepts UIDs made of ASCII letters, digits, '-', '_' and '.',
// starting and ending with a letter or digit, without "..": safe as one
// path element and as the start of a CDI device name.
func Validate(uid types.UID) error {
	s := string(uid)
	if s == "" {
		return fmt.Errorf("claim UID is empty")
	}
	if len(s) > MaxLen {
		return fmt.Errorf("claim UID %.40q... is longer than %d characters", s, MaxLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (c != '-' && c != '_' && c != '.' || i == 0 || i == len(s)-1) {
			return fmt.Errorf("claim UID %q: character %q at %d is not allowed (letters, digits, and '-', '_', '.' inside)", s, c, i)
		}
	}
	if strings.Contains(s, "..") {
		return fmt.Errorf("claim UID %q contains \"..\"", s)
	}
	return nil
}
