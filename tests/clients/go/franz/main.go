// The franz-go client (github.com/twmb/franz-go/pkg/kgo) as the integration tests drive it
// through the proxy: produce, assign, group (PROTOCOL classic, or consumer for KIP-848) and
// share steps; see package steps for the command line and the output.  Fetch sessions are
// on (kgo's default).  Every connection the client opens is printed ("connect" lines), so a
// test can check it only ever reached the proxy.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"kafka-fetch-proxy/tests/clients/internal/steps"
)

// connects prints every broker connection the client opens.
type connects struct{}

func (connects) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	line := map[string]any{"op": "connect", "id": meta.NodeID, "host": meta.Host, "port": meta.Port}
	if err != nil {
		line["error"] = err.Error()
	}
	steps.Emit(line)
}

func main() {
	args := steps.Parse()
	steps.Emit(map[string]any{"op": "start", "client": "franz-go"})
	steps.Run(args, func(s steps.Step) error {
		ctx, cancel := context.WithTimeout(context.Background(), args.Timeout)
		defer cancel()
		base := []kgo.Opt{
			kgo.SeedBrokers(args.Bootstrap...),
			kgo.ClientID(args.ClientID + "-" + s.Op),
			kgo.WithHooks(connects{}),
		}
		switch s.Op {
		case "produce":
			return produce(ctx, base, s)
		case "assign":
			return assign(ctx, base, s)
		case "group":
			return group(ctx, base, s)
		case "share":
			return share(ctx, base, s)
		}
		return fmt.Errorf("unknown step %q", s.Op)
	})
}

// brokers prints the brokers a Metadata request through the client reports.
func brokers(ctx context.Context, step string, cl *kgo.Client) error {
	resp, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	var nodes []steps.Node
	for _, b := range resp.Brokers {
		nodes = append(nodes, steps.Node{ID: b.NodeID, Host: b.Host, Port: b.Port})
	}
	steps.EmitNodes(step, nodes)
	return nil
}

func produce(ctx context.Context, base []kgo.Opt, s steps.Step) error {
	cl, err := kgo.NewClient(append(base,
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.RequiredAcks(kgo.AllISRAcks()), // idempotence is on by default
		kgo.ProducerLinger(5*time.Millisecond),
	)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	var (
		mu    sync.Mutex
		first error
		last  = map[int32]int64{}
		wg    sync.WaitGroup
	)
	for i := 0; i < s.Count; i++ {
		p, k, v := steps.Record(s, i)
		wg.Add(1)
		cl.Produce(ctx, &kgo.Record{Topic: s.Topic, Partition: p, Key: []byte(k), Value: []byte(v)},
			func(r *kgo.Record, err error) {
				defer wg.Done()
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					if first == nil {
						first = err
					}
					return
				}
				if r.Offset >= last[r.Partition] {
					last[r.Partition] = r.Offset
				}
			})
	}
	wg.Wait()
	if first != nil {
		return first
	}
	if err := brokers(ctx, "produce", cl); err != nil {
		return err
	}
	steps.Emit(map[string]any{"op": "produced", "count": s.Count, "last_offsets": last})
	return nil
}

// poll reads until n records arrived, printing each.
func poll(ctx context.Context, cl *kgo.Client, step string, n int) error {
	got := 0
	for got < n {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return fmt.Errorf("%d of %d records in time", got, n)
		}
		var ferr error
		fetches.EachError(func(t string, p int32, err error) {
			ferr = fmt.Errorf("fetch %s[%d]: %w", t, p, err)
		})
		if ferr != nil {
			return ferr
		}
		fetches.EachRecord(func(r *kgo.Record) {
			steps.EmitRecord(step, r.Partition, r.Offset, r.Key, r.Value)
			got++
		})
	}
	return nil
}

func assign(ctx context.Context, base []kgo.Opt, s steps.Step) error {
	parts := map[int32]kgo.Offset{}
	for p := int32(0); p < s.Partitions; p++ {
		parts[p] = kgo.NewOffset().AtStart()
	}
	cl, err := kgo.NewClient(append(base,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{s.Topic: parts}),
	)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := poll(ctx, cl, "assign", s.Count); err != nil {
		return err
	}
	if err := brokers(ctx, "assign", cl); err != nil {
		return err
	}
	return nil
}

func group(ctx context.Context, base []kgo.Opt, s steps.Step) error {
	id := fmt.Sprintf("g-franz-%s-%d", s.Extra, time.Now().UnixNano())
	opts := append(base,
		kgo.ConsumerGroup(id),
		kgo.ConsumeTopics(s.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
	)
	switch s.Extra {
	case "classic":
	case "consumer": // KIP-848: the broker assigns; kgo needs a range or sticky balancer for it
		opts = append(opts, kgo.ServerSideBalancer(), kgo.Balancers(kgo.RangeBalancer()))
	default:
		return fmt.Errorf("unknown group protocol %q", s.Extra)
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := poll(ctx, cl, "group", s.Count); err != nil {
		return err
	}
	if err := cl.CommitUncommittedOffsets(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	committed, err := fetchCommitted(ctx, cl, id, s.Topic)
	if err != nil {
		return err
	}
	steps.Emit(map[string]any{"op": "committed", "group": id, "protocol": s.Extra, "offsets": committed})
	if err := brokers(ctx, "group", cl); err != nil {
		return err
	}
	cl.LeaveGroup()
	return nil
}

// fetchCommitted asks the group coordinator (OffsetFetch) what the group committed.
func fetchCommitted(ctx context.Context, cl *kgo.Client, groupID, topic string) (map[int32]int64, error) {
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = groupID
	rt := kmsg.NewOffsetFetchRequestTopic()
	rt.Topic = topic
	for p := int32(0); p < 1024; p++ { // every partition the topic may have
		rt.Partitions = append(rt.Partitions, p)
	}
	req.Topics = []kmsg.OffsetFetchRequestTopic{rt}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("offset fetch: %w", err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return nil, fmt.Errorf("offset fetch: %w", err)
	}
	out := map[int32]int64{}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil && !errors.Is(err, kerr.UnknownTopicOrPartition) {
				return nil, fmt.Errorf("offset fetch %s[%d]: %w", t.Topic, p.Partition, err)
			}
			if p.Offset >= 0 {
				out[p.Partition] = p.Offset
			}
		}
	}
	return out, nil
}

// setShareReset makes a share group start at the earliest offset (a GROUP config).
func setShareReset(ctx context.Context, cl *kgo.Client, groupID string) error {
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = groupID
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name = "share.auto.offset.reset"
	v := "earliest"
	c.Value = &v
	c.Op = kmsg.IncrementalAlterConfigOpSet
	res.Configs = append(res.Configs, c)
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return err
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			return fmt.Errorf("set share.auto.offset.reset: %w", err)
		}
	}
	return nil
}

func share(ctx context.Context, base []kgo.Opt, s steps.Step) error {
	id := fmt.Sprintf("sg-franz-%d", time.Now().UnixNano())
	admin, err := kgo.NewClient(base...)
	if err != nil {
		return err
	}
	err = setShareReset(ctx, admin, id)
	admin.Close()
	if err != nil {
		return err
	}
	var (
		mu      sync.Mutex
		ackErrs []string
	)
	cl, err := kgo.NewClient(append(base,
		kgo.ShareGroup(id),
		kgo.ConsumeTopics(s.Topic),
		kgo.ShareAckCallback(func(_ *kgo.Client, rs kgo.ShareAckResults) {
			mu.Lock()
			defer mu.Unlock()
			for _, r := range rs {
				if r.Err != nil {
					ackErrs = append(ackErrs, fmt.Sprintf("%s[%d]: %v", r.Topic, r.Partition, r.Err))
				}
			}
		}),
	)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	acked := map[[2]int64]bool{}
	deliveries := 0
	for len(acked) < s.Count {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return fmt.Errorf("%d of %d records acknowledged in time", len(acked), s.Count)
		}
		var ferr error
		fetches.EachError(func(t string, p int32, err error) {
			ferr = fmt.Errorf("share fetch %s[%d]: %w", t, p, err)
		})
		if ferr != nil {
			return ferr
		}
		var polled []*kgo.Record
		fetches.EachRecord(func(r *kgo.Record) {
			steps.Emit(map[string]any{"op": "record", "step": "share", "p": r.Partition, "o": r.Offset,
				"k": string(r.Key), "v": string(r.Value), "delivery_count": r.DeliveryCount()})
			polled = append(polled, r)
		})
		if len(polled) == 0 {
			continue
		}
		deliveries += len(polled)
		cl.MarkAcks(kgo.AckAccept, polled...)
		if err := cl.FlushAcks(ctx); err != nil {
			return fmt.Errorf("flush acks: %w", err)
		}
		mu.Lock()
		errs := append([]string(nil), ackErrs...)
		mu.Unlock()
		if len(errs) > 0 {
			sort.Strings(errs)
			return fmt.Errorf("acknowledgements failed: %v", errs)
		}
		for _, r := range polled {
			acked[[2]int64{int64(r.Partition), r.Offset}] = true
		}
		steps.Emit(map[string]any{"op": "acknowledged", "records": len(polled), "total": len(acked)})
	}
	if err := brokers(ctx, "share", cl); err != nil {
		return err
	}
	steps.Emit(map[string]any{"op": "share_done", "group": id, "deliveries": deliveries})
	return nil
}
