// Package yamlfile decodes the operator's YAML files (activities, coupon
// batches) strictly and the same way: one document, no unknown keys, and a
// version named by the file's content.
package yamlfile

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"go.yaml.in/yaml/v3"
)

// Decode decodes b into v (a pointer to the file's struct), refusing
// unknown keys. Errors: "the file is empty", "not a valid <kind> file:
// ...", and "the file holds more than one YAML document: one <unit> per
// file".
func Decode(b []byte, v any, kind, unit string) error {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(v); errors.Is(err, io.EOF) {
		return errors.New("the file is empty")
	} else if err != nil {
		return fmt.Errorf("not a valid %s file: %w", kind, err)
	}
	var more yaml.Node
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return fmt.Errorf("the file holds more than one YAML document: one %s per file", unit)
	}
	return nil
}

// Version names a file's content: the first 12 hex digits of its SHA-256.
func Version(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:12]
}
