package guard

import (
	"redcell/storage"
)

var _ storage.Breaker = (*Breaker)(nil)

// Allow implements storage.Breaker: b in front of a database's connections
// (storage.MySQL.SetBreaker), asked before each round trip. The breaker
// counts as failures the errors Infrastructure names and the driver's and
// server's own (storage.DriverFailure), and deadlines after SlowCall; a
// cancellation counts as nothing, and every other error (the server
// answered: a duplicate key, a deadlock) as a success. While open it
// refuses every round trip (the store answers storage.ErrDBOpen). It times
// the round trip from Allow to done on Config.Clock.
func (b *Breaker) Allow() (done func(err error) (failure bool), err error) {
	report, err := b.allow()
	if err != nil {
		return nil, err
	}
	return func(err error) bool { return report(err, judgeDB) }, nil
}

// judgeDB sorts a database round trip's error.
func judgeDB(err error) bool { return Infrastructure(err) || storage.DriverFailure(err) }
