// Package recipes embeds the data files keel's built-in recipes use, so
// that the binary runs its quickstart from anywhere.
package recipes

import "embed"

// FS holds heldout-d2-4.jsonl, the held-out problems of the quickstart.
//
//go:embed heldout-d2-4.jsonl
var FS embed.FS
