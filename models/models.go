// Package models embeds keel's built-in models, so that the binary runs
// its quickstart from anywhere: tiny-moe-base is the cold-start base model
// of recipes/sft-tiny-moe.yaml (README, "Cold start").
package models

import "embed"

// FS holds tiny-moe-base/ (config.json, model.safetensors, tokenizer.json).
//
//go:embed tiny-moe-base
var FS embed.FS
