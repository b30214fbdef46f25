package storage

import (
	"context"

	"redcell/model"
)

// One write method and one read method.
//
// A store's writes are CommitGroup's alone, and its reads Read's alone (with
// the audits, the schema and Ping beside them). What an operation is lives in
// a type of its own: its inputs, and the answers the store sets.
//
//   - A MoneyOp: the money operations (open, send, deposit, withdraw,
//     credits, refund, reward issue and booking, coupon accept), one type
//     each, that share a group's locking reads and multi-row writes
//     (moneyops.go, group.go).
//   - A typed op (the ops_*.go files: coupon takes and decisions, lease
//     grants and returns, identity binds, reward takes, the relay's and
//     reconciliation's positions): the whole of its group, run in a
//     transaction of its own. CommitGroup answers the errors its type's
//     doc comment gives.
//
// A Query is one read: a typed struct with its inputs and, once Read returns
// nil, its answer.

// Op is one operation of a group. The types that implement it are this
// package's: the money ops and the typed ops.
type Op interface{ isOp() }

// Query is one read of Reader.Read. The types that implement it are this
// package's (the ops_*.go files).
type Query interface{ isQuery() }

// Reader answers queries.
type Reader interface {
	// Read runs q and sets its answer. Errors: those q's doc comment gives,
	// ErrInvalidArgument for a query this store does not answer, or an
	// infrastructure failure.
	Read(ctx context.Context, q Query) error
}

// Ops returns gs as a group's op list.
func Ops[T Op](gs []T) []Op {
	ops := make([]Op, len(gs))
	for i, g := range gs {
		ops[i] = g
	}
	return ops
}

// SplitOps returns ops's money kinds, or its one typed op: a typed op is the
// whole of its group, so a list that holds one beside anything else is
// ErrInvalidArgument. Both stores' CommitGroup start with it.
func SplitOps(ops []Op) (money []MoneyOp, typed Op, err error) {
	money = make([]MoneyOp, 0, len(ops))
	for _, op := range ops {
		switch o := op.(type) {
		case MoneyOp:
			money = append(money, o)
		case nil:
			return nil, nil, model.Invalidf("group holds a nil op")
		default:
			typed = o
		}
	}
	if typed != nil && len(ops) != 1 {
		return nil, nil, model.Invalidf("a typed op (%T) is the whole of its group; this one holds %d ops", typed, len(ops))
	}
	return money, typed, nil
}

// UnknownOp is the error for an op or query a store does not run.
func UnknownOp(what any) error {
	return model.Invalidf("%T is not an op or query this store runs", what)
}

// Dispatch runs x (a typed op or a query) through the first of a store's
// handlers that takes it (ok true), one handler per area (ops_*.go), and
// answers UnknownOp when none does.
func Dispatch[T any](ctx context.Context, x T, handlers ...func(context.Context, T) (bool, error)) error {
	for _, h := range handlers {
		if ok, err := h(ctx, x); ok {
			return err
		}
	}
	return UnknownOp(x)
}
