// The Java client (org.apache.kafka:kafka-clients) as the integration tests drive it through the
// proxy.  One JVM runs several steps in order, so a test pays the JVM's start-up once:
//
//   java -cp <classes>:<kafka-clients jars> ProxyClient --bootstrap HOST:PORT --client-id ID \
//        [--timeout SECONDS] STEP [STEP ...]
//
// Steps (TOPIC has PARTITIONS partitions; N records; TAG marks a producer's values):
//   produce,TOPIC,PARTITIONS,N,TAG      record i goes to partition i % PARTITIONS with
//                                       key "k<p>-<seq>" and value "TAG|<p>|<seq>|" + "v" * (seq % 40),
//                                       seq = i / PARTITIONS; acks=all, idempotence on
//   assign,TOPIC,PARTITIONS,N           assign() every partition, seek to the beginning, read N
//   group,TOPIC,PARTITIONS,N,PROTOCOL   subscribe() in a new group (group.protocol classic or
//                                       consumer), read N, commitSync, report committed offsets
//   share,TOPIC,PARTITIONS,N            KafkaShareConsumer in a new share group whose
//                                       share.auto.offset.reset is set to earliest (Admin
//                                       incrementalAlterConfigs on the GROUP resource), explicit
//                                       acknowledgement, until every one of N records is
//                                       acknowledged
//   txn,TOPIC,PARTITIONS,N,TAG,TXNS     a transactional producer writes the records of produce
//                                       in TXNS transactions of N / TXNS consecutive records;
//                                       transaction t is aborted when t % 3 == 1 (after a flush,
//                                       so its records are in the log), else committed; the last
//                                       one must commit.  One "sent" line per record (with its
//                                       offset and outcome), one "txn" line per transaction
//   read_committed,TOPIC,PARTITIONS,N   assign() every partition with isolation.level
//                                       read_committed, seek to the beginning, read N, then on
//                                       until every position reaches the end offset (the last
//                                       stable offset); a "positions" line reports both
//   ctp,TOPIC,PARTITIONS,N,DEST         consume-transform-produce: a read_committed consumer in a
//                                       new classic group (max.poll.records 25) and a
//                                       transactional producer; each poll's records go to the same
//                                       partition of DEST with value "ctp|" + value, and the
//                                       offsets after them to the transaction
//                                       (sendOffsetsToTransaction); the second transaction is
//                                       aborted and its records re-read (seek back), the others
//                                       commit, until N records are committed; reports the group's
//                                       committed offsets
//
// Output: JSON lines on stdout ({"op": ...}); one "record" line per record delivered.  Any
// error, or a step that does not finish within the timeout, exits non-zero.
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.UUID;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public final class ProxyClient {
  private String bootstrap;
  private String clientId = "kfp-java";
  private long timeoutMs = 60_000;

  public static void main(String[] args) {
    try {
      new ProxyClient().run(args);
    } catch (Throwable t) {
      System.out.flush();
      System.err.println("ProxyClient failed:");
      t.printStackTrace();
      System.exit(1);
    }
    System.exit(0);
  }

  private void run(String[] args) throws Exception {
    List<String[]> steps = new ArrayList<>();
    for (int i = 0; i < args.length; i++) {
      switch (args[i]) {
        case "--bootstrap" -> bootstrap = args[++i];
        case "--client-id" -> clientId = args[++i];
        case "--timeout" -> timeoutMs = (long) (Double.parseDouble(args[++i]) * 1000);
        default -> steps.add(args[i].split(","));
      }
    }
    if (bootstrap == null || steps.isEmpty()) {
      throw new IllegalArgumentException("usage: --bootstrap HOST:PORT [--client-id ID] STEP...");
    }
    emit(obj("op", "start", "client", "kafka-clients"));
    for (String[] s : steps) {
      long started = System.nanoTime();
      String topic = s[1];
      int partitions = Integer.parseInt(s[2]);
      int count = Integer.parseInt(s[3]);
      switch (s[0]) {
        case "produce" -> produce(topic, partitions, count, s[4]);
        case "assign" -> assign(topic, partitions, count);
        case "group" -> group(topic, partitions, count, s[4]);
        case "share" -> share(topic, count);
        case "txn" -> txn(topic, partitions, count, s[4], Integer.parseInt(s[5]));
        case "read_committed" -> readCommitted(topic, partitions, count);
        case "ctp" -> ctp(topic, partitions, count, s[4]);
        default -> throw new IllegalArgumentException("unknown step " + s[0]);
      }
      long ms = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - started);
      emit(obj("op", "done", "step", s[0], "ms", ms));
    }
  }

  // -- steps --------------------------------------------------------------------------------

  private void produce(String topic, int partitions, int count, String tag) throws Exception {
    Properties props = common("produce");
    props.put(ProducerConfig.ACKS_CONFIG, "all");
    props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
    props.put(ProducerConfig.LINGER_MS_CONFIG, "5");
    props.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, Long.toString(timeoutMs));
    AtomicReference<Exception> failed = new AtomicReference<>();
    Map<Integer, Long> last = new TreeMap<>();
    try (KafkaProducer<String, String> producer =
        new KafkaProducer<>(props, new StringSerializer(), new StringSerializer())) {
      for (int i = 0; i < count; i++) {
        int p = i % partitions;
        int seq = i / partitions;
        String value = tag + "|" + p + "|" + seq + "|" + "v".repeat(seq % 40);
        producer.send(
            new ProducerRecord<>(topic, p, "k" + p + "-" + seq, value),
            (md, err) -> {
              if (err != null) {
                failed.compareAndSet(null, err);
              } else {
                synchronized (last) {
                  last.merge(md.partition(), md.offset(), Math::max);
                }
              }
            });
      }
      producer.flush();
      if (failed.get() != null) {
        throw failed.get();
      }
      emitMetadata("produce", producer.partitionsFor(topic));
    }
    emit(obj("op", "produced", "count", count, "last_offsets", last));
  }

  private void assign(String topic, int partitions, int count) {
    Properties props = common("assign");
    props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    try (KafkaConsumer<String, String> consumer =
        new KafkaConsumer<>(props, new StringDeserializer(), new StringDeserializer())) {
      List<TopicPartition> tps = new ArrayList<>();
      for (int p = 0; p < partitions; p++) {
        tps.add(new TopicPartition(topic, p));
      }
      consumer.assign(tps);
      consumer.seekToBeginning(tps);
      readAll(consumer, "assign", count);
      emitMetadata("assign", consumer.partitionsFor(topic));
    }
  }

  private void group(String topic, int partitions, int count, String protocol) {
    Properties props = common("group-" + protocol);
    String groupId = "g-java-" + protocol + "-" + UUID.randomUUID().toString().substring(0, 8);
    props.put(ConsumerConfig.GROUP_ID_CONFIG, groupId);
    props.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, protocol);
    props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    try (KafkaConsumer<String, String> consumer =
        new KafkaConsumer<>(props, new StringDeserializer(), new StringDeserializer())) {
      consumer.subscribe(List.of(topic));
      readAll(consumer, "group", count);
      consumer.commitSync(Duration.ofMillis(timeoutMs));
      Set<TopicPartition> tps = new HashSet<>();
      for (int p = 0; p < partitions; p++) {
        tps.add(new TopicPartition(topic, p));
      }
      Map<Integer, Long> committed = new TreeMap<>();
      for (Map.Entry<TopicPartition, OffsetAndMetadata> e :
          consumer.committed(tps, Duration.ofMillis(timeoutMs)).entrySet()) {
        if (e.getValue() != null) {
          committed.put(e.getKey().partition(), e.getValue().offset());
        }
      }
      emit(obj("op", "committed", "group", groupId, "protocol", protocol, "offsets", committed));
      emitMetadata("group", consumer.partitionsFor(topic));
    }
  }

  private void txn(String topic, int partitions, int count, String tag, int txns)
      throws Exception {
    if (txns < 1 || count % txns != 0 || (txns - 1) % 3 == 1) {
      throw new IllegalArgumentException("txn: N must split into TXNS, the last one committed");
    }
    Properties props = transactional("txn", topic);
    int per = count / txns;
    try (KafkaProducer<String, String> producer =
        new KafkaProducer<>(props, new StringSerializer(), new StringSerializer())) {
      producer.initTransactions();
      for (int t = 0; t < txns; t++) {
        boolean commit = t % 3 != 1;
        String outcome = commit ? "commit" : "abort";
        producer.beginTransaction();
        List<Object[]> sent = new ArrayList<>();
        List<java.util.concurrent.Future<RecordMetadata>> futures = new ArrayList<>();
        for (int i = t * per; i < (t + 1) * per; i++) {
          int p = i % partitions;
          int seq = i / partitions;
          String key = "k" + p + "-" + seq;
          String value = tag + "|" + p + "|" + seq + "|" + "v".repeat(seq % 40);
          sent.add(new Object[] {key, value});
          futures.add(producer.send(new ProducerRecord<>(topic, p, key, value)));
        }
        producer.flush();
        for (int j = 0; j < futures.size(); j++) {
          RecordMetadata md = futures.get(j).get(timeoutMs, TimeUnit.MILLISECONDS);
          emit(obj("op", "sent", "step", "txn", "txn", t, "outcome", outcome, "p", md.partition(),
              "o", md.offset(), "k", sent.get(j)[0], "v", sent.get(j)[1]));
        }
        if (commit) {
          producer.commitTransaction();
        } else {
          producer.abortTransaction();
        }
        emit(obj("op", "txn", "step", "txn", "txn", t, "outcome", outcome, "records", per));
      }
      emitMetadata("txn", producer.partitionsFor(topic));
    }
  }

  private void readCommitted(String topic, int partitions, int count) {
    Properties props = common("read-committed");
    props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
    try (KafkaConsumer<String, String> consumer =
        new KafkaConsumer<>(props, new StringDeserializer(), new StringDeserializer())) {
      List<TopicPartition> tps = new ArrayList<>();
      for (int p = 0; p < partitions; p++) {
        tps.add(new TopicPartition(topic, p));
      }
      consumer.assign(tps);
      consumer.seekToBeginning(tps);
      long deadline = System.currentTimeMillis() + timeoutMs;
      int got = 0;
      Map<TopicPartition, Long> end = null;
      while (true) {
        if (System.currentTimeMillis() > deadline) {
          throw new IllegalStateException(
              "read_committed: " + got + " of " + count + " records in time");
        }
        if (got >= count) {
          if (end == null) {
            end = consumer.endOffsets(tps, Duration.ofMillis(timeoutMs));
          }
          boolean atEnd = true;
          for (TopicPartition tp : tps) {
            atEnd &= consumer.position(tp, Duration.ofMillis(timeoutMs)) >= end.get(tp);
          }
          if (atEnd) {
            break;
          }
        }
        for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) {
          Map<String, Object> line = record("read_committed", r);
          line.put("topic", r.topic());
          emit(line);
          got++;
        }
      }
      Map<Integer, Long> positions = new TreeMap<>();
      Map<Integer, Long> ends = new TreeMap<>();
      for (TopicPartition tp : tps) {
        positions.put(tp.partition(), consumer.position(tp, Duration.ofMillis(timeoutMs)));
        ends.put(tp.partition(), end.get(tp));
      }
      emit(obj("op", "positions", "step", "read_committed", "topic", topic, "positions",
          positions, "end", ends));
      emitMetadata("read_committed", consumer.partitionsFor(topic));
    }
  }

  private void ctp(String source, int partitions, int count, String dest) throws Exception {
    Properties cprops = common("ctp-consumer");
    String groupId = "g-java-ctp-" + UUID.randomUUID().toString().substring(0, 8);
    cprops.put(ConsumerConfig.GROUP_ID_CONFIG, groupId);
    cprops.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "classic");
    cprops.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    cprops.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    cprops.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
    cprops.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "25");
    Properties pprops = transactional("ctp", dest);
    long deadline = System.currentTimeMillis() + timeoutMs;
    try (KafkaConsumer<String, String> consumer =
            new KafkaConsumer<>(cprops, new StringDeserializer(), new StringDeserializer());
        KafkaProducer<String, String> producer =
            new KafkaProducer<>(pprops, new StringSerializer(), new StringSerializer())) {
      producer.initTransactions();
      consumer.subscribe(List.of(source));
      int done = 0;
      int attempt = 0;
      while (done < count) {
        if (System.currentTimeMillis() > deadline) {
          throw new IllegalStateException("ctp: " + done + " of " + count + " records in time");
        }
        ConsumerRecords<String, String> polled = consumer.poll(Duration.ofMillis(200));
        if (polled.isEmpty()) {
          continue;
        }
        boolean commit = attempt != 1;
        producer.beginTransaction();
        AtomicReference<Exception> failed = new AtomicReference<>();
        Map<TopicPartition, OffsetAndMetadata> next = new HashMap<>();
        Map<TopicPartition, Long> first = new HashMap<>();
        for (ConsumerRecord<String, String> r : polled) {
          TopicPartition tp = new TopicPartition(r.topic(), r.partition());
          first.putIfAbsent(tp, r.offset());
          next.put(tp, new OffsetAndMetadata(r.offset() + 1));
          producer.send(
              new ProducerRecord<>(dest, r.partition(), r.key(), "ctp|" + r.value()),
              (md, err) -> {
                if (err != null) {
                  failed.compareAndSet(null, err);
                }
              });
        }
        producer.sendOffsetsToTransaction(next, consumer.groupMetadata());
        producer.flush();
        if (failed.get() != null) {
          throw failed.get();
        }
        Map<Integer, Long> offsets = new TreeMap<>();
        next.forEach((tp, o) -> offsets.put(tp.partition(), o.offset()));
        if (commit) {
          producer.commitTransaction();
          done += polled.count();
        } else {
          producer.abortTransaction();
          first.forEach(consumer::seek); // process these records again
        }
        emit(obj("op", "txn", "step", "ctp", "txn", attempt, "outcome",
            commit ? "commit" : "abort", "records", polled.count(), "offsets", offsets));
        attempt++;
      }
      Set<TopicPartition> tps = new HashSet<>();
      for (int p = 0; p < partitions; p++) {
        tps.add(new TopicPartition(source, p));
      }
      Map<Integer, Long> committed = new TreeMap<>();
      for (Map.Entry<TopicPartition, OffsetAndMetadata> e :
          consumer.committed(tps, Duration.ofMillis(timeoutMs)).entrySet()) {
        if (e.getValue() != null) {
          committed.put(e.getKey().partition(), e.getValue().offset());
        }
      }
      emit(obj("op", "committed", "step", "ctp", "group", groupId, "protocol", "classic",
          "offsets", committed));
      emitMetadata("ctp", consumer.partitionsFor(source));
    }
  }

  private void readAll(KafkaConsumer<String, String> consumer, String step, int count) {
    long deadline = System.currentTimeMillis() + timeoutMs;
    int got = 0;
    while (got < count) {
      if (System.currentTimeMillis() > deadline) {
        throw new IllegalStateException(step + ": " + got + " of " + count + " records in time");
      }
      for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) {
        emit(record(step, r));
        got++;
      }
    }
  }

  private void share(String topic, int count) throws Exception {
    String groupId = "sg-java-" + UUID.randomUUID().toString().substring(0, 8);
    Properties adminProps = new Properties();
    adminProps.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    adminProps.put(AdminClientConfig.CLIENT_ID_CONFIG, clientId + "-admin");
    try (Admin admin = Admin.create(adminProps)) {
      ConfigResource group = new ConfigResource(ConfigResource.Type.GROUP, groupId);
      AlterConfigOp earliest =
          new AlterConfigOp(
              new ConfigEntry("share.auto.offset.reset", "earliest"), AlterConfigOp.OpType.SET);
      admin
          .incrementalAlterConfigs(Map.of(group, List.of(earliest)))
          .all()
          .get(timeoutMs, TimeUnit.MILLISECONDS);
      Collection<Node> nodes =
          admin.describeCluster().nodes().get(timeoutMs, TimeUnit.MILLISECONDS);
      emit(obj("op", "metadata", "step", "share", "nodes", nodeList(nodes)));
    }
    Properties props = common("share");
    props.put(ConsumerConfig.GROUP_ID_CONFIG, groupId);
    props.put(ConsumerConfig.SHARE_ACKNOWLEDGEMENT_MODE_CONFIG, "explicit");
    long deadline = System.currentTimeMillis() + timeoutMs;
    Set<String> acknowledged = new HashSet<>();
    int deliveries = 0;
    try (KafkaShareConsumer<String, String> consumer =
        new KafkaShareConsumer<>(props, new StringDeserializer(), new StringDeserializer())) {
      consumer.subscribe(List.of(topic));
      while (acknowledged.size() < count) {
        if (System.currentTimeMillis() > deadline) {
          throw new IllegalStateException(
              "share: " + acknowledged.size() + " of " + count + " records acknowledged in time");
        }
        List<ConsumerRecord<String, String>> polled = new ArrayList<>();
        for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) {
          Map<String, Object> line = record("share", r);
          line.put("delivery_count", r.deliveryCount().map(Short::intValue).orElse(-1));
          emit(line);
          consumer.acknowledge(r, AcknowledgeType.ACCEPT);
          polled.add(r);
          deliveries++;
        }
        if (polled.isEmpty()) {
          continue;
        }
        Map<TopicIdPartition, Optional<KafkaException>> results =
            consumer.commitSync(Duration.ofMillis(timeoutMs));
        Map<String, String> errors = new TreeMap<>();
        for (Map.Entry<TopicIdPartition, Optional<KafkaException>> e : results.entrySet()) {
          e.getValue().ifPresent(err -> errors.put(e.getKey().toString(), err.toString()));
        }
        if (!errors.isEmpty()) {
          throw new IllegalStateException("share acknowledgements failed: " + errors);
        }
        for (ConsumerRecord<String, String> r : polled) {
          acknowledged.add(r.partition() + ":" + r.offset());
        }
        emit(obj("op", "acknowledged", "records", polled.size(), "total", acknowledged.size()));
      }
    }
    emit(obj("op", "share_done", "group", groupId, "deliveries", deliveries));
  }

  // -- helpers ------------------------------------------------------------------------------

  private Properties common(String role) {
    Properties props = new Properties();
    props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    props.put(ConsumerConfig.CLIENT_ID_CONFIG, clientId + "-" + role);
    return props;
  }

  private Properties transactional(String role, String topic) {
    Properties props = common(role);
    props.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, clientId + "-" + role + "-" + topic);
    props.put(ProducerConfig.LINGER_MS_CONFIG, "5");
    props.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, Long.toString(timeoutMs));
    props.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, Long.toString(timeoutMs));
    return props;
  }

  private static Map<String, Object> record(String step, ConsumerRecord<String, String> r) {
    return obj("op", "record", "step", step, "p", r.partition(), "o", r.offset(), "k", r.key(),
        "v", r.value());
  }

  private static void emitMetadata(String step, List<PartitionInfo> infos) {
    Set<Node> nodes = new HashSet<>();
    for (PartitionInfo info : infos) {
      if (info.leader() != null) {
        nodes.add(info.leader());
      }
      for (Node n : info.replicas()) {
        nodes.add(n);
      }
    }
    emit(obj("op", "metadata", "step", step, "nodes", nodeList(nodes)));
  }

  private static List<Object> nodeList(Collection<Node> nodes) {
    List<Object> out = new ArrayList<>();
    for (Node n : nodes) {
      out.add(obj("id", n.id(), "host", n.host(), "port", n.port()));
    }
    return out;
  }

  private static Map<String, Object> obj(Object... kv) {
    return JsonLines.obj(kv);
  }

  private static void emit(Map<String, Object> line) {
    JsonLines.emit(line);
  }
}
