package model

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"strconv"
	"time"
)

// ShardCount is the number of logical shards. Changing it moves every key.
const ShardCount = 1000

// ShardID is a logical shard, 0..ShardCount-1.
type ShardID int

// ShardsPerDB is how many shards one database (db_XX) holds: its t_y_dd
// tables, y = s%10.
const ShardsPerDB = 10

// DBCount is the number of databases, db_00..db_99: the unit a cell owns and
// the unit that moves between cells.
const DBCount = ShardCount / ShardsPerDB

// DB is the database index of the shard: shard s lives in db_{s/10:02}.
func (s ShardID) DB() int { return int(s) / ShardsPerDB }

// Table is the table index of the shard inside its database: s%10.
func (s ShardID) Table() int { return int(s) % 10 }

// Valid reports whether s is in 0..ShardCount-1.
func (s ShardID) Valid() bool { return s >= 0 && s < ShardCount }

// MaxIDLen bounds act_ids and order numbers.
const MaxIDLen = 64

// ValidateActID checks an account ID (actID): 1..64 characters of [A-Za-z0-9_-].
// Errors: ErrInvalidArgument.
func ValidateActID(s string) error { return validateToken("act_id", s) }

// ValidateOrderNo checks a caller's order number (idempotency key): 1..64
// characters of [A-Za-z0-9_-]. Internal order numbers contain ':' and so can never
// collide with a caller's. Errors: ErrInvalidArgument.
func ValidateOrderNo(s string) error { return validateToken("order_no", s) }

func validateToken(field, s string) error {
	if len(s) == 0 || len(s) > MaxIDLen {
		return Invalidf("%s must be 1..%d characters", field, MaxIDLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return Invalidf("%s may hold only ASCII letters, digits, '_' and '-'", field)
		}
	}
	return nil
}

// PacketIDLen is the length of a packet ID: YYYYMMDD (8) + shard (3) + 16 hex digits.
const PacketIDLen = 27

// PacketID identifies a red packet. It carries the sender's shard and the UTC day
// of creation, so db_xx.t_packet_y_dd is found from the ID alone:
// "20261129" + "417" + "9f86d081884c7d65".
type PacketID string

// PacketRef is what a parsed packet ID tells: where its rows live.
type PacketRef struct {
	ID    PacketID
	Shard ShardID
	Year  int
	Month time.Month
	Day   int // day of month, 1..31: the dd of t_packet_y_dd
}

// NewPacketID makes a packet ID for shard s created at t (UTC date), with 64
// random bits so IDs made in parallel never collide in practice; the table's
// primary key turns the impossible case into an error, never a merge.
func NewPacketID(s ShardID, t time.Time) PacketID {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("crypto/rand failed: " + err.Error())
	}
	return PacketIDFrom(s, t, binary.BigEndian.Uint64(b[:]))
}

// PacketIDFrom is NewPacketID with the 64 random bits given: the simulation
// draws them from its seeded stream so that a seed replays the same IDs.
func PacketIDFrom(s ShardID, t time.Time, bits uint64) PacketID {
	t = t.UTC()
	return PacketID(fmt.Sprintf("%04d%02d%02d%03d%016x", t.Year(), int(t.Month()), t.Day(), int(s), bits))
}

// ParsePacketID validates s strictly and returns where the packet lives.
// Errors: ErrInvalidArgument.
func ParsePacketID(s string) (PacketRef, error) {
	if len(s) != PacketIDLen {
		return PacketRef{}, Invalidf("packet_id must be %d characters", PacketIDLen)
	}
	for i := 0; i < 11; i++ {
		if s[i] < '0' || s[i] > '9' {
			return PacketRef{}, Invalidf("packet_id must start with 11 digits")
		}
	}
	for i := 11; i < PacketIDLen; i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return PacketRef{}, Invalidf("packet_id must end with 16 lowercase hex digits")
		}
	}
	year, _ := strconv.Atoi(s[0:4])
	month, _ := strconv.Atoi(s[4:6])
	day, _ := strconv.Atoi(s[6:8])
	shard, _ := strconv.Atoi(s[8:11])
	d := time.Date(year, time.Month(month), day, 0, 0, 0, 0, time.UTC)
	if year < 2000 || d.Year() != year || int(d.Month()) != month || d.Day() != day {
		return PacketRef{}, Invalidf("packet_id carries an invalid date")
	}
	return PacketRef{ID: PacketID(s), Shard: ShardID(shard), Year: year, Month: time.Month(month), Day: day}, nil
}

// ClaimID is the ID of one claim: the packet ID, "c", and the claim's sequence
// number in the packet (1..count). It is the order number of the credit on the
// claimant's side, so a claim is credited at most once.
func ClaimID(p PacketID, seq int64) string { return string(p) + "c" + strconv.FormatInt(seq, 10) }

// ParseClaimID splits a claim ID into its packet and sequence number.
// Errors: ErrInvalidArgument.
func ParseClaimID(s string) (PacketRef, int64, error) {
	if len(s) < PacketIDLen+2 || len(s) > PacketIDLen+9 || s[PacketIDLen] != 'c' {
		return PacketRef{}, 0, Invalidf("malformed claim_id")
	}
	ref, err := ParsePacketID(s[:PacketIDLen])
	if err != nil {
		return PacketRef{}, 0, err
	}
	seq, err := strconv.ParseInt(s[PacketIDLen+1:], 10, 64)
	if err != nil || seq < 1 || strconv.FormatInt(seq, 10) != s[PacketIDLen+1:] {
		return PacketRef{}, 0, Invalidf("malformed claim_id")
	}
	return ref, seq, nil
}
