// The sarama client (github.com/IBM/sarama) as the integration tests drive it through the
// proxy: produce, assign and group (classic protocol: sarama has no other) steps; see package
// steps for the command line and the output.  sarama never uses fetch sessions: every Fetch
// lists every partition.
package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"

	"github.com/IBM/sarama"

	"kafka-fetch-proxy/tests/clients/internal/steps"
)

func config(clientID string) *sarama.Config {
	c := sarama.NewConfig()
	c.ClientID = clientID
	c.Version = sarama.V3_9_0_0 // the newest request versions both test brokers (3.9, 4.x) serve
	c.Metadata.Full = false
	return c
}

func main() {
	args := steps.Parse()
	steps.Emit(map[string]any{"op": "start", "client": "sarama"})
	steps.Run(args, func(s steps.Step) error {
		ctx, cancel := context.WithTimeout(context.Background(), args.Timeout)
		defer cancel()
		c := config(args.ClientID + "-" + s.Op)
		switch s.Op {
		case "produce":
			return produce(args.Bootstrap, c, s)
		case "assign":
			return assign(ctx, args.Bootstrap, c, s)
		case "group":
			if s.Extra != "classic" {
				return fmt.Errorf("sarama has only the classic group protocol, not %q", s.Extra)
			}
			return group(ctx, args.Bootstrap, c, s)
		}
		return fmt.Errorf("unknown step %q", s.Op)
	})
}

// brokers prints the brokers the client learned from metadata.
func brokers(step string, cl sarama.Client) error {
	var nodes []steps.Node
	for _, b := range cl.Brokers() {
		host, port, err := net.SplitHostPort(b.Addr())
		if err != nil {
			return err
		}
		n, err := strconv.Atoi(port)
		if err != nil {
			return err
		}
		nodes = append(nodes, steps.Node{ID: b.ID(), Host: host, Port: int32(n)})
	}
	steps.EmitNodes(step, nodes)
	return nil
}

func produce(bootstrap []string, c *sarama.Config, s steps.Step) error {
	c.Producer.Idempotent = true
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Net.MaxOpenRequests = 1 // what sarama requires for idempotence
	c.Producer.Return.Successes = true
	c.Producer.Partitioner = sarama.NewManualPartitioner
	cl, err := sarama.NewClient(bootstrap, c)
	if err != nil {
		return err
	}
	defer cl.Close()
	producer, err := sarama.NewSyncProducerFromClient(cl)
	if err != nil {
		return err
	}
	msgs := make([]*sarama.ProducerMessage, 0, s.Count)
	for i := 0; i < s.Count; i++ {
		p, k, v := steps.Record(s, i)
		msgs = append(msgs, &sarama.ProducerMessage{
			Topic: s.Topic, Partition: p, Key: sarama.StringEncoder(k), Value: sarama.StringEncoder(v),
		})
	}
	if err := producer.SendMessages(msgs); err != nil {
		return err
	}
	if err := producer.Close(); err != nil {
		return err
	}
	last := map[int32]int64{}
	for _, m := range msgs {
		if m.Offset >= last[m.Partition] {
			last[m.Partition] = m.Offset
		}
	}
	if err := brokers("produce", cl); err != nil {
		return err
	}
	steps.Emit(map[string]any{"op": "produced", "count": s.Count, "last_offsets": last})
	return nil
}

func assign(ctx context.Context, bootstrap []string, c *sarama.Config, s steps.Step) error {
	c.Consumer.Return.Errors = true
	cl, err := sarama.NewClient(bootstrap, c)
	if err != nil {
		return err
	}
	defer cl.Close()
	consumer, err := sarama.NewConsumerFromClient(cl)
	if err != nil {
		return err
	}
	defer consumer.Close()
	msgs := make(chan *sarama.ConsumerMessage)
	errs := make(chan error, s.Partitions)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for p := int32(0); p < s.Partitions; p++ {
		pc, err := consumer.ConsumePartition(s.Topic, p, sarama.OffsetOldest)
		if err != nil {
			close(stop)
			wg.Wait()
			return err
		}
		wg.Add(1)
		go func() { // one goroutine per partition keeps each partition's order
			defer wg.Done()
			defer pc.AsyncClose()
			for {
				select {
				case m := <-pc.Messages():
					select {
					case msgs <- m:
					case <-stop:
						return
					}
				case err := <-pc.Errors():
					errs <- err
					return
				case <-stop:
					return
				}
			}
		}()
	}
	defer wg.Wait()
	defer close(stop)
	for got := 0; got < s.Count; got++ {
		select {
		case m := <-msgs:
			steps.EmitRecord("assign", m.Partition, m.Offset, m.Key, m.Value)
		case err := <-errs:
			return err
		case <-ctx.Done():
			return fmt.Errorf("%d of %d records in time", got, s.Count)
		}
	}
	return brokers("assign", cl)
}

// handler reads a group's claims until the test's count is reached, then cancels.
type handler struct {
	mu     sync.Mutex
	got    int
	want   int
	cancel context.CancelFunc
}

func (h *handler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *handler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *handler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for {
		select {
		case m, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			h.mu.Lock()
			steps.EmitRecord("group", m.Partition, m.Offset, m.Key, m.Value)
			sess.MarkMessage(m, "")
			h.got++
			done := h.got >= h.want
			h.mu.Unlock()
			if done {
				sess.Commit()
				h.cancel()
			}
		case <-sess.Context().Done():
			return nil
		}
	}
}

func group(ctx context.Context, bootstrap []string, c *sarama.Config, s steps.Step) error {
	id := fmt.Sprintf("g-sarama-%s", s.Topic)
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.Consumer.Offsets.AutoCommit.Enable = false
	c.Consumer.Return.Errors = true
	cl, err := sarama.NewClient(bootstrap, c)
	if err != nil {
		return err
	}
	defer cl.Close()
	cg, err := sarama.NewConsumerGroupFromClient(id, cl)
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	h := &handler{want: s.Count, cancel: stop}
	groupErrs := make(chan error, 1)
	go func() {
		for err := range cg.Errors() {
			select {
			case groupErrs <- err:
			default:
			}
			stop()
		}
	}()
	for runCtx.Err() == nil {
		if err := cg.Consume(runCtx, []string{s.Topic}, h); err != nil {
			return err
		}
	}
	if err := cg.Close(); err != nil {
		return err
	}
	select {
	case err := <-groupErrs:
		return err
	default:
	}
	h.mu.Lock()
	got := h.got
	h.mu.Unlock()
	if got < s.Count {
		return fmt.Errorf("%d of %d records in time", got, s.Count)
	}
	admin, err := sarama.NewClusterAdminFromClient(cl)
	if err != nil {
		return err
	}
	parts := make([]int32, 0, s.Partitions)
	for p := int32(0); p < s.Partitions; p++ {
		parts = append(parts, p)
	}
	resp, err := admin.ListConsumerGroupOffsets(id, map[string][]int32{s.Topic: parts})
	if err != nil {
		return err
	}
	committed := map[int32]int64{}
	for _, p := range parts {
		b := resp.GetBlock(s.Topic, p)
		if b == nil {
			continue
		}
		if b.Err != sarama.ErrNoError {
			return fmt.Errorf("offset fetch %s[%d]: %w", s.Topic, p, b.Err)
		}
		if b.Offset >= 0 {
			committed[p] = b.Offset
		}
	}
	steps.Emit(map[string]any{"op": "committed", "group": id, "protocol": "classic", "offsets": committed})
	return brokers("group", cl)
}
