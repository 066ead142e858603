//go:build tools

// The commands make crio builds, kept in the module graph for go mod tidy: CRI-O's daemon and
// its test image copier (an OCI archive into CRI-O's containers/storage, with no registry).
package tools

import (
	_ "github.com/cri-o/cri-o/cmd/crio"
	_ "github.com/cri-o/cri-o/test/copyimg"
)
