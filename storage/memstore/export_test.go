package memstore

import "redcell/model"

// putFlow writes f as a flow row of shard sh and adds delta to the balance of
// f.ActID's wallet there, with none of the store's checks: the contract's
// Harness.PutFlow (storage.PutFlowRow in MariaDB), for flow rows no call of
// the suite writes (reward, withdraw) and for books broken on purpose (delta
// other than f.Amount).
func (s *Store) putFlow(sh model.ShardID, f model.Flow, delta model.Cents) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flowSeq++
	f.Seq = s.flowSeq
	s.flows[flowKey{sh, f.ActID, f.OrderNo}] = &f
	s.accounts[acctKey{sh, f.ActID}] += delta
}
