//go:build tools

// The command make promtool builds, kept in the module graph for go mod tidy.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
