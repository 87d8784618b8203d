//go:build tools

// crane, from the same module, pushes the images (hack/push.sh): built beside the registry.
package main

import _ "github.com/google/go-containerregistry/cmd/crane"
