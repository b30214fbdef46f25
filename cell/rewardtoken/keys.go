package rewardtoken

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"

	"redcell/internal/atomicfile"
)

// KeyState is what a key of the ring may do.
type KeyState string

const (
	// StateActive signs and verifies. A ring has exactly one.
	StateActive KeyState = "active"
	// StateVerify verifies only: the tokens signed before a rotation.
	StateVerify KeyState = "verify"
	// StateRetired refuses the tokens it signed (ErrRetiredKey).
	StateRetired KeyState = "retired"
)

// KeyIDMax bounds a key ID; KeysMax bounds the keys of one file.
const (
	KeyIDMax = 16
	KeysMax  = 64 // one rotation a day keeps two months of keys; retired ones can be dropped
)

// keyFile is the YAML key file:
//
//	keys:
//	  - {id: k1, state: verify, seed: <64 hex digits>}
//	  - {id: k2, state: active, seed: <64 hex digits>}
//
// seed is a 32-byte Ed25519 seed in hex. The file is a secret (mode 0600).
type keyFile struct {
	Keys []keyEntry `yaml:"keys"`
}

type keyEntry struct {
	ID    string   `yaml:"id"`
	State KeyState `yaml:"state"`
	Seed  string   `yaml:"seed"`
}

type key struct {
	id    string
	state KeyState
	priv  ed25519.PrivateKey
	pub   ed25519.PublicKey
}

// Ring is a loaded, valid set of keys: one active key that signs, and verify
// and retired keys by ID. Immutable once built, so safe for concurrent use; a
// reload builds a new Ring (LoadRing) and the caller swaps the pointer whole
// (an atomic.Pointer[Ring]), keeping the old one when the file is bad.
type Ring struct {
	keys   map[string]*key
	active *key
}

// ActiveID is the ID of the key Sign uses.
func (r *Ring) ActiveID() string { return r.active.id }

// LoadRing reads and parses the key file at path (ParseRing); its errors
// name the file.
func LoadRing(path string) (*Ring, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("rewardtoken: %w", err)
	}
	r, _, err := parse(b)
	if err != nil {
		return nil, fmt.Errorf("rewardtoken: %s: %w", path, err)
	}
	return r, nil
}

// ParseRing decodes a key file (unknown YAML keys refused) and checks it: at
// least one key, at most KeysMax; each ID valid (ValidateKeyID) and used
// once; each state active, verify or retired, and exactly one active; each
// seed 64 hex digits. The error lists every problem found; it never quotes
// a seed.
func ParseRing(b []byte) (*Ring, error) {
	r, _, err := parse(b)
	if err != nil {
		return nil, fmt.Errorf("rewardtoken: %w", err)
	}
	return r, nil
}

func parse(b []byte) (*Ring, keyFile, error) {
	var f keyFile
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); errors.Is(err, io.EOF) {
		return nil, f, errors.New("the key file is empty")
	} else if err != nil {
		return nil, f, fmt.Errorf("not a valid key file: %w", err)
	}
	var more yaml.Node
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return nil, f, errors.New("the key file holds more than one YAML document")
	}
	r, err := build(f)
	return r, f, err
}

// build checks f and makes its ring.
func build(f keyFile) (*Ring, error) {
	var ps []string
	bad := func(format string, args ...any) { ps = append(ps, fmt.Sprintf(format, args...)) }
	if len(f.Keys) == 0 {
		bad("keys: no key")
	}
	if len(f.Keys) > KeysMax {
		bad("keys: %d keys, above %d: drop retired ones", len(f.Keys), KeysMax)
	}
	r := &Ring{keys: map[string]*key{}}
	var actives []string
	for i, e := range f.Keys {
		where := fmt.Sprintf("keys[%d]", i)
		if err := ValidateKeyID(e.ID); err != nil {
			bad("%s.id: %v", where, err)
		} else if r.keys[e.ID] != nil {
			bad("%s.id: %q twice", where, e.ID)
		}
		switch e.State {
		case StateActive:
			actives = append(actives, e.ID)
		case StateVerify, StateRetired:
		default:
			bad("%s.state: unknown state %q (active, verify, retired)", where, e.State)
		}
		seed, err := hex.DecodeString(e.Seed)
		if err != nil || len(seed) != ed25519.SeedSize {
			// Never quote the seed: errors end up in logs.
			bad("%s.seed: not %d hex digits (a %d-byte Ed25519 seed): %d characters, not shown", where,
				2*ed25519.SeedSize, ed25519.SeedSize, len(e.Seed))
			continue
		}
		priv := ed25519.NewKeyFromSeed(seed)
		k := &key{id: e.ID, state: e.State, priv: priv, pub: priv.Public().(ed25519.PublicKey)}
		if r.keys[e.ID] == nil {
			r.keys[e.ID] = k
		}
		if e.State == StateActive {
			r.active = k
		}
	}
	switch {
	case len(actives) == 0 && len(f.Keys) > 0:
		bad("keys: no active key: exactly one signs")
	case len(actives) > 1:
		bad("keys: %d active keys (%s): exactly one signs", len(actives), strings.Join(actives, ", "))
	}
	if len(ps) > 0 {
		return nil, errors.New("invalid key file: " + strings.Join(ps, "; "))
	}
	return r, nil
}

// ValidateKeyID checks a key ID: 1..KeyIDMax characters of [A-Za-z0-9-]
// (never '.', which separates a token's parts).
func ValidateKeyID(id string) error {
	if len(id) == 0 || len(id) > KeyIDMax {
		return fmt.Errorf("key ID must be 1..%d characters, got %d", KeyIDMax, len(id))
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("key ID %q may hold only ASCII letters, digits and '-'", id)
		}
	}
	return nil
}

// NewKeyFile writes a new key file at path with one active key id and a
// fresh seed from crypto/rand, mode 0600. It refuses a path that exists
// (never overwrites keys that signed tokens clients still hold).
func NewKeyFile(path, id string) error {
	if err := ValidateKeyID(id); err != nil {
		return fmt.Errorf("rewardtoken: %w", err)
	}
	e, err := newEntry(id)
	if err != nil {
		return err
	}
	b, err := marshal(keyFile{Keys: []keyEntry{e}})
	if err != nil {
		return err
	}
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("rewardtoken: new key file: %w", err)
	}
	_, err = fh.Write(b)
	if err == nil {
		err = fh.Sync()
	}
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path) // a half-written key file would only fail to load later
		return fmt.Errorf("rewardtoken: new key file: %w", err)
	}
	return nil
}

// Rotate makes the active key of the key file at path a verify key and adds
// newID as the new active key with a fresh seed. The file must be valid and
// newID unused (retired IDs too). The file is rewritten whole through a
// temporary file in its directory and a rename, mode 0600, so a reader sees
// the old file or the new one; its comments are not kept. Not safe against a
// concurrent Rotate of the same file. Running services pick the new key up
// on their next LoadRing.
func Rotate(path, newID string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("rewardtoken: rotate: %w", err)
	}
	_, f, err := parse(b)
	if err != nil {
		return fmt.Errorf("rewardtoken: rotate %s: %w", path, err)
	}
	if err := ValidateKeyID(newID); err != nil {
		return fmt.Errorf("rewardtoken: rotate: %w", err)
	}
	for i := range f.Keys {
		if f.Keys[i].ID == newID {
			return fmt.Errorf("rewardtoken: rotate %s: key ID %q is taken (state %s)", path, newID, f.Keys[i].State)
		}
		if f.Keys[i].State == StateActive {
			f.Keys[i].State = StateVerify
		}
	}
	e, err := newEntry(newID)
	if err != nil {
		return err
	}
	f.Keys = append(f.Keys, e)
	if _, err := build(f); err != nil { // e.g. KeysMax
		return fmt.Errorf("rewardtoken: rotate %s: %w", path, err)
	}
	out, err := marshal(f)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(path, out, 0o600); err != nil {
		return fmt.Errorf("rewardtoken: write key file: %w", err)
	}
	return nil
}

func newEntry(id string) (keyEntry, error) {
	seed := make([]byte, ed25519.SeedSize)
	if _, err := rand.Read(seed); err != nil {
		return keyEntry{}, fmt.Errorf("rewardtoken: seed: %w", err)
	}
	return keyEntry{ID: id, State: StateActive, Seed: hex.EncodeToString(seed)}, nil
}

const fileHeader = `# Reward token keys (cell/rewardtoken). Secret: keep mode 0600.
# state: active signs (exactly one), verify only verifies (tokens signed
# before a rotation), retired refuses its tokens. seed: 32-byte Ed25519 seed, hex.
`

func marshal(f keyFile) ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteString(fileHeader)
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(f); err != nil {
		return nil, fmt.Errorf("rewardtoken: encode key file: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("rewardtoken: encode key file: %w", err)
	}
	if _, _, err := parse(buf.Bytes()); err != nil {
		panic("rewardtoken: a key file written does not parse: " + err.Error())
	}
	return buf.Bytes(), nil
}
