package storage

import (
	"fmt"
	"testing"

	"redcell/model"
)

// BenchmarkTableNames: the names one grouped open of a cold packet and its
// credit use (the packet's and claim's day tables, the relay position, the
// claimant's flow and account tables), as the statements build them.
func BenchmarkTableNames(b *testing.B) {
	m := &MySQL{ns: "t01_"}
	n := 0
	for i := range b.N {
		s := model.ShardID(i % model.ShardCount)
		n += len(m.packetTable(s, 6)) + len(m.claimTable(s, 6)) + len(m.relayPosTable(s.DB())) + len(m.flowTable(s)) + len(m.accountTable(s))
	}
	if n == 0 {
		b.Fatal("no names")
	}
}

// The names made once are the names the schema has: every shard's and
// database's, every day's, in the real and the shadow namespace and after
// the namespace changes (OpenPrefixed sets it after Open).
func TestTableNames(t *testing.T) {
	m := &MySQL{}
	for _, ns := range []string{"", "t01_", "t01_" + ShadowPrefix} {
		m.ns = ns
		for s := range model.ShardID(model.ShardCount) {
			db := fmt.Sprintf("%sdb_%02d", ns, s/10)
			want := []string{db, db + fmt.Sprintf(".t_account_%d", s%10), db + fmt.Sprintf(".t_flow_%d", s%10)}
			got := []string{m.dbName(s), m.accountTable(s), m.flowTable(s)}
			for day := ArchiveDay; day <= 31; day += 7 {
				want = append(want, db+fmt.Sprintf(".t_packet_%d_%02d", s%10, day), db+fmt.Sprintf(".t_claim_%d_%02d", s%10, day))
				got = append(got, m.packetTable(s, day), m.claimTable(s, day))
			}
			if s%10 == 0 {
				d := int(s / 10)
				want = append(want, db+".t_relay_position", db+".t_reward", db+".t_coupon_req", db+".t_coupon_person")
				got = append(got, m.relayPosTable(d), m.rewardTable(d), m.couponReqTable(d), m.couponPersonTable(d))
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("ns %q shard %d: %v, want %v", ns, s, got, want)
			}
		}
	}
	for _, bad := range []func(){func() { m.packetTable(5, 32) }, func() { m.flowTable(model.ShardCount) }, func() { m.relayPosTable(100) }} {
		func() {
			defer func() {
				if recover() == nil {
					t.Error("a name out of range did not panic")
				}
			}()
			bad()
		}()
	}
}
