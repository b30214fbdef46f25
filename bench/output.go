package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// Names of the files WriteFiles writes.
const (
	ReportMarkdownFile = "report.md"
	ReportJSONFile     = "report.json"
	ChartFile          = "chart.svg"
)

// WriteFiles writes the suite into dir (created if missing): report.md,
// report.json (the Suite) and chart.svg.
func WriteFiles(dir string, s Suite) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	var md, svg bytes.Buffer
	if err := s.WriteMarkdown(&md, ChartFile); err != nil {
		return fmt.Errorf("bench: render %s: %w", ReportMarkdownFile, err)
	}
	if err := s.WriteSVG(&svg); err != nil {
		return fmt.Errorf("bench: render %s: %w", ChartFile, err)
	}
	js, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("bench: encode %s: %w", ReportJSONFile, err)
	}
	for name, b := range map[string][]byte{ReportMarkdownFile: md.Bytes(), ReportJSONFile: append(js, '\n'), ChartFile: svg.Bytes()} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
	}
	return nil
}
