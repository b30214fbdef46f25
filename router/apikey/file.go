package apikey

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"

	"redcell/internal/atomicfile"
	"redcell/internal/clock"
	"redcell/internal/incident"
	"redcell/model"
)

// File is the key file at a path as a router uses it: the current Set, read
// again when the file changes (Reload, Watch), and keys added and revoked
// (Add, Revoke), which rewrite the file and take effect at once in this
// process. Several routers (and `redcell apikey`) may share one file: a change
// is made under an exclusive lock on "<path>.lock" and written to a temporary
// file renamed over the old one, so a reader never sees half a file. Safe for
// concurrent use.
type File struct {
	path  string
	log   *slog.Logger
	cur   atomic.Pointer[Set]
	fails *incident.Tracker

	mu    sync.Mutex // guards stamp; held while this process reads or changes the file
	stamp stamp      // of the file as last read; zero: it did not exist
}

// stamp tells whether a file changed: a rename gives it a new inode, an edit
// in place a new size or modification time.
type stamp struct {
	ino   uint64
	size  int64
	mtime time.Time
}

func stampOf(fi fs.FileInfo) stamp {
	st := stamp{size: fi.Size(), mtime: fi.ModTime()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.ino = sys.Ino
	}
	return st
}

// doc is the file's YAML.
type doc struct {
	Keys []Key `yaml:"keys"`
}

const fileHeader = `# redcell API keys (router.api_keys): one entry per key, with the app it
# belongs to, the SHA-256 of the key and the scopes it grants. The keys
# themselves are kept nowhere: each was shown once, when it was made. Routers
# read this file again within a second of a change. Manage it with
# "redcell apikey add|list|revoke" or on a router's admin port (/admin/keys).
`

// Open reads the key file at path. A file that does not exist yet is an empty
// set (every request is refused until a key is added); one that cannot be
// read or parsed is an error.
func Open(path string, log *slog.Logger) (*File, error) {
	if path == "" {
		return nil, errors.New("apikey: no key file given (router.api_keys)")
	}
	f := &File{path: path, log: log, fails: incident.New(log, "reading the API key file "+path, incident.DefaultEvery)}
	f.mu.Lock()
	defer f.mu.Unlock()
	keys, st, err := f.readLocked()
	if err != nil {
		return nil, err
	}
	set, err := NewSet(keys)
	if err != nil {
		return nil, fmt.Errorf("apikey: %s: %w", path, err)
	}
	f.cur.Store(set)
	f.stamp = st
	if st == (stamp{}) {
		log.Warn("no API key file yet: every request is refused until a key is added", "path", path)
	}
	return f, nil
}

// Path returns the file's path.
func (f *File) Path() string { return f.path }

// Check authenticates key for scope against the keys as last read; see Set.Check.
func (f *File) Check(key []byte, scope Scope) (string, error) { return f.cur.Load().Check(key, scope) }

// Len returns how many usable keys the current set holds.
func (f *File) Len() int { return f.cur.Load().Len() }

// readLocked reads and parses the file; f.mu must be held. A missing file is
// no keys and a zero stamp.
func (f *File) readLocked() ([]Key, stamp, error) {
	// One open file for both the bytes and the stamp: a rename between a read
	// by path and a stat by path would pair the old keys with the new file's
	// stamp, and no later change check would read the new keys.
	fh, err := os.Open(f.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, stamp{}, nil
	}
	if err != nil {
		return nil, stamp{}, fmt.Errorf("apikey: %w", err)
	}
	defer fh.Close()
	fi, err := fh.Stat()
	if err != nil {
		return nil, stamp{}, fmt.Errorf("apikey: %w", err)
	}
	b, err := io.ReadAll(fh)
	if err != nil {
		return nil, stamp{}, fmt.Errorf("apikey: %w", err)
	}
	var d doc
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&d); err != nil && !errors.Is(err, io.EOF) { // EOF: an empty file, no keys
		return nil, stamp{}, fmt.Errorf("apikey: %s: %w", f.path, err)
	}
	return d.Keys, stampOf(fi), nil
}

// errVanished: the key file was read before and is gone now.
var errVanished = errors.New("apikey: the key file is gone; the keys read before stay in use until it is back")

// Reload reads the file again if it changed since it was last read and swaps
// in its keys. On an error (a file being written by hand, say) the keys in use
// stay as they were; so they do when a file read before has gone (a deploy
// tool replacing it by delete and create): errVanished, until it is back.
// To refuse every key, revoke them or leave an empty file, not none.
func (f *File) Reload() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var st stamp
	fi, err := os.Stat(f.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if f.stamp != (stamp{}) {
			return errVanished
		}
	case err != nil:
		return fmt.Errorf("apikey: %w", err)
	default:
		st = stampOf(fi)
	}
	if st == f.stamp {
		return nil
	}
	keys, st, err := f.readLocked()
	if err != nil {
		return err
	}
	if st == (stamp{}) && f.stamp != (stamp{}) {
		return errVanished // gone between the look and the read
	}
	set, err := NewSet(keys)
	if err != nil {
		return fmt.Errorf("apikey: %s: %w", f.path, err)
	}
	f.cur.Store(set)
	f.stamp = st
	f.log.Info("API keys reloaded", "path", f.path, "usable_keys", set.Len())
	return nil
}

// Watch calls Reload each time every has passed since the previous call
// ended (clock.Every), until ctx ends. A file that cannot be
// read or parsed is logged when that starts and when it ends (not at every
// look); the keys in use stay as they were meanwhile.
func (f *File) Watch(ctx context.Context, every time.Duration) {
	clock.Every(ctx, nil, every, func(int) {
		if err := f.Reload(); err != nil {
			f.fails.Fail(err)
		} else {
			f.fails.OK()
		}
	})
}

// List returns every entry of the file, revoked ones included, as it is now.
func (f *File) List() ([]Key, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	keys, _, err := f.readLocked()
	return keys, err
}

// Add makes a key for app with scopes, writes its entry to the file and
// returns the key string (shown once: only its hash is stored) and the entry.
// Errors: an invalid app or scope list; the file cannot be read or written.
func (f *File) Add(app string, scopes []Scope, now time.Time) (string, Key, error) {
	key, k, err := Generate(app, scopes, now)
	if err != nil {
		return "", Key{}, err
	}
	err = f.change(func(keys []Key) ([]Key, error) { return append(keys, k), nil })
	if err != nil {
		return "", Key{}, err
	}
	return key, k, nil
}

// Revoke marks key id revoked at now in the file: from then on every router
// refuses it (within a second, when it reads the file again; this process at
// once). Revoking a revoked key changes nothing. It returns the entry.
// Errors: model.ErrNotFound for an unknown id; the file cannot be read or written.
func (f *File) Revoke(id string, now time.Time) (Key, error) {
	var out Key
	err := f.change(func(keys []Key) ([]Key, error) {
		for i := range keys {
			if keys[i].ID != id {
				continue
			}
			if keys[i].RevokedAt == nil {
				t := now.UTC().Truncate(time.Second)
				keys[i].RevokedAt = &t
			}
			out = keys[i]
			return keys, nil
		}
		return nil, model.Errorf(model.ErrNotFound, "no API key with id %q", id)
	})
	return out, err
}

// change applies edit to the file's entries under the file lock, writes the
// result and makes it the set in use.
func (f *File) change(edit func([]Key) ([]Key, error)) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	unlock, err := lockFile(f.path + ".lock")
	if err != nil {
		return err
	}
	defer unlock()
	keys, _, err := f.readLocked()
	if err != nil {
		return err
	}
	if keys, err = edit(keys); err != nil {
		return err
	}
	set, err := NewSet(keys)
	if err != nil {
		return err
	}
	if err := writeFile(f.path, keys); err != nil {
		return err
	}
	fi, err := os.Stat(f.path)
	if err != nil {
		return fmt.Errorf("apikey: %w", err)
	}
	f.cur.Store(set)
	f.stamp = stampOf(fi)
	return nil
}

// lockFile takes an exclusive flock on path (made if missing) and returns its release.
func lockFile(path string) (func(), error) {
	lf, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("apikey: lock: %w", err)
	}
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX); err != nil {
		lf.Close()
		return nil, fmt.Errorf("apikey: lock %s: %w", path, err)
	}
	return func() { _ = syscall.Flock(int(lf.Fd()), syscall.LOCK_UN); lf.Close() }, nil
}

// writeFile writes keys to path whole (atomicfile.Write), readable by its
// owner only.
func writeFile(path string, keys []Key) error {
	body, err := yaml.Marshal(doc{Keys: keys})
	if err != nil {
		return fmt.Errorf("apikey: encode: %w", err)
	}
	if err := atomicfile.Write(path, append([]byte(fileHeader), body...), 0o600); err != nil {
		return fmt.Errorf("apikey: write %s: %w", path, err)
	}
	return nil
}
