// Package atomicfile replaces a file whole, so that a reader sees the old
// content or the new, never a part, and the new content survives a crash once
// written.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write replaces path with b: it writes a temporary file (mode perm) in the
// same directory, named "."+base+".tmp-*", fsyncs it, renames it over path
// and then fsyncs the directory so the rename is durable (best effort: an
// error there is not returned). The temporary file is removed on any error.
// Errors are the os package's (*PathError or *LinkError, naming the file);
// callers add their own prefix. Concurrent Writes of one path each land
// whole; the last rename wins.
func Write(path string, b []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	err = tmp.Chmod(perm)
	if err == nil {
		_, err = tmp.Write(b)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return err
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync() // the rename itself survives a crash
		d.Close()
	}
	return nil
}
