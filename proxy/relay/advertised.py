"""The (api_key, versions) ApiVersions may offer: ``endpoints.advertised_source()``'s output.

Generated from kio's schemas by the derivation in ``endpoints``; checked against it
by tests/unit/test_apiversions_loop.py, whose failure message says how to regenerate
it.  A table, not the derivation at run time: the derivation imports every schema
module kio has (about a thousand, 1-2 s of CPU on a loaded machine), which the first
upstream ApiVersions answer's rewrite did on the event loop, serving no other client meanwhile.
"""

ADVERTISED: dict[int, tuple[int, int]] = {
    0: (3, 13),  # produce
    1: (4, 18),  # fetch
    2: (1, 11),  # list_offsets
    3: (0, 13),  # metadata
    8: (2, 10),  # offset_commit
    9: (1, 10),  # offset_fetch
    10: (0, 6),  # find_coordinator
    11: (0, 9),  # join_group
    12: (0, 4),  # heartbeat
    13: (0, 5),  # leave_group
    14: (0, 5),  # sync_group
    15: (0, 6),  # describe_groups
    16: (0, 5),  # list_groups
    17: (0, 1),  # sasl_handshake
    18: (0, 4),  # api_versions
    19: (2, 7),  # create_topics
    20: (1, 6),  # delete_topics
    21: (0, 2),  # delete_records
    22: (0, 6),  # init_producer_id
    23: (2, 4),  # offset_for_leader_epoch
    24: (0, 5),  # add_partitions_to_txn
    25: (0, 4),  # add_offsets_to_txn
    26: (0, 5),  # end_txn
    27: (1, 2),  # write_txn_markers
    28: (0, 5),  # txn_offset_commit
    29: (1, 3),  # describe_acls
    30: (1, 3),  # create_acls
    31: (1, 3),  # delete_acls
    32: (1, 4),  # describe_configs
    33: (0, 2),  # alter_configs
    34: (1, 2),  # alter_replica_log_dirs
    35: (1, 5),  # describe_log_dirs
    36: (0, 2),  # sasl_authenticate
    37: (0, 3),  # create_partitions
    38: (1, 3),  # create_delegation_token
    39: (1, 2),  # renew_delegation_token
    40: (1, 2),  # expire_delegation_token
    41: (1, 3),  # describe_delegation_token
    42: (0, 2),  # delete_groups
    43: (0, 2),  # elect_leaders
    44: (0, 1),  # incremental_alter_configs
    45: (0, 1),  # alter_partition_reassignments
    46: (0, 0),  # list_partition_reassignments
    47: (0, 0),  # offset_delete
    48: (0, 1),  # describe_client_quotas
    49: (0, 1),  # alter_client_quotas
    50: (0, 0),  # describe_user_scram_credentials
    51: (0, 0),  # alter_user_scram_credentials
    52: (0, 0),  # vote
    53: (0, 0),  # begin_quorum_epoch
    54: (0, 0),  # end_quorum_epoch
    55: (0, 1),  # describe_quorum
    56: (2, 3),  # alter_partition
    57: (0, 2),  # update_features
    58: (0, 0),  # envelope
    59: (0, 0),  # fetch_snapshot
    60: (0, 2),  # describe_cluster
    61: (0, 0),  # describe_producers
    62: (0, 4),  # broker_registration
    63: (0, 2),  # broker_heartbeat
    64: (0, 0),  # unregister_broker
    65: (0, 0),  # describe_transactions
    66: (0, 2),  # list_transactions
    67: (0, 0),  # allocate_producer_ids
    68: (0, 1),  # consumer_group_heartbeat
    69: (0, 1),  # consumer_group_describe
    70: (0, 0),  # controller_registration
    71: (0, 0),  # get_telemetry_subscriptions
    72: (0, 0),  # push_telemetry
    73: (0, 0),  # assign_replicas_to_dirs
    74: (0, 1),  # list_config_resources
    75: (0, 0),  # describe_topic_partitions
    76: (1, 1),  # share_group_heartbeat
    77: (1, 1),  # share_group_describe
    78: (1, 2),  # share_fetch
    79: (1, 2),  # share_acknowledge
    80: (0, 1),  # add_raft_voter
    81: (0, 0),  # remove_raft_voter
    83: (0, 0),  # initialize_share_group_state
    84: (0, 0),  # read_share_group_state
    85: (0, 1),  # write_share_group_state
    86: (0, 0),  # delete_share_group_state
    87: (0, 1),  # read_share_group_state_summary
    88: (0, 0),  # streams_group_heartbeat
    89: (0, 0),  # streams_group_describe
    90: (0, 1),  # describe_share_group_offsets
    91: (0, 0),  # alter_share_group_offsets
    92: (0, 0),  # delete_share_group_offsets
}
"""api_key: (lowest, highest) version offered; every version between is offered."""
