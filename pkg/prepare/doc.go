// Package prepare is the PrepareData stage: the DataProducer interface, and
// the graph that orders a configuration's producers by the data keys they
// produce and consume, checks their types at start-up, and runs them per
// request within a deadline, publishing nothing a producer wrote after it.
package prepare
