/* Prints the size and every field offset of the structs in bridge/ds4_bridge.h as the C
 * compiler lays them out, one "name value" per line; ds4-sys's tests/layout.rs compares them
 * with the Rust mirror (run by ctest with DS4_ABI_LAYOUT pointing here). */
#include <stddef.h>
#include <stdio.h>

#include "bridge/ds4_bridge.h"

#define S(T) printf(#T " %zu\n", sizeof(T))
#define F(T, f) printf(#T "." #f " %zu\n", offsetof(T, f))

int main(void) {
    S(ds4_bridge_model_open_options);
    F(ds4_bridge_model_open_options, model_path);
    F(ds4_bridge_model_open_options, mtp_path);
    F(ds4_bridge_model_open_options, backend);
    F(ds4_bridge_model_open_options, n_threads);
    F(ds4_bridge_model_open_options, defer_boot_prewarm);
    F(ds4_bridge_model_open_options, ssd_streaming);
    F(ds4_bridge_model_open_options, ssd_streaming_cold);
    F(ds4_bridge_model_open_options, ssd_streaming_cache_experts);
    F(ds4_bridge_model_open_options, ssd_streaming_cache_bytes);
    F(ds4_bridge_model_open_options, mtp_draft_tokens);
    F(ds4_bridge_model_open_options, tensor_directory);
    F(ds4_bridge_model_open_options, bind_plan);
    F(ds4_bridge_model_open_options, drafter_path);
    F(ds4_bridge_model_open_options, draft_max);
    F(ds4_bridge_model_open_options, ssd_streaming_store_dir);
    F(ds4_bridge_model_open_options, drafter_import);

    S(ds4_bridge_model_info_t);
    F(ds4_bridge_model_info_t, family);
    F(ds4_bridge_model_info_t, name);
    F(ds4_bridge_model_info_t, n_layer);
    F(ds4_bridge_model_info_t, n_embd);
    F(ds4_bridge_model_info_t, n_vocab);
    F(ds4_bridge_model_info_t, n_head);
    F(ds4_bridge_model_info_t, head_dim);
    F(ds4_bridge_model_info_t, n_expert);
    F(ds4_bridge_model_info_t, n_expert_used);
    F(ds4_bridge_model_info_t, n_ctx_max);
    F(ds4_bridge_model_info_t, fingerprint);

    S(ds4_bridge_memory_t);
    F(ds4_bridge_memory_t, weights_bytes);
    F(ds4_bridge_memory_t, cache_bytes);
    F(ds4_bridge_memory_t, scratch_bytes);
    F(ds4_bridge_memory_t, device_free);
    F(ds4_bridge_memory_t, device_total);
    F(ds4_bridge_memory_t, device_weights_bytes);
    F(ds4_bridge_memory_t, backend);
    F(ds4_bridge_memory_t, device);

    S(ds4_bridge_memory_ex_t);
    F(ds4_bridge_memory_ex_t, base);
    F(ds4_bridge_memory_ex_t, drafter_weights_bytes);
    F(ds4_bridge_memory_ex_t, drafter_mapped_bytes);
    F(ds4_bridge_memory_ex_t, shared_bytes);
    F(ds4_bridge_memory_ex_t, private_bytes);

    S(ds4_bridge_drafter_device_t);
    F(ds4_bridge_drafter_device_t, on_device);
    F(ds4_bridge_drafter_device_t, export_fd);
    F(ds4_bridge_drafter_device_t, imported);
    F(ds4_bridge_drafter_device_t, read_only);
    F(ds4_bridge_drafter_device_t, bytes);
    F(ds4_bridge_drafter_device_t, granularity);
    F(ds4_bridge_drafter_device_t, layout_hash);
    F(ds4_bridge_drafter_device_t, uuid);
    F(ds4_bridge_drafter_device_t, why);

    S(ds4_bridge_chat_msg);
    F(ds4_bridge_chat_msg, role);
    F(ds4_bridge_chat_msg, content);
    F(ds4_bridge_chat_msg, content_len);

    S(ds4_bridge_spec_counters_t);
    F(ds4_bridge_spec_counters_t, trials);
    F(ds4_bridge_spec_counters_t, drafted);
    F(ds4_bridge_spec_counters_t, accepted);
    F(ds4_bridge_spec_counters_t, fallbacks);
    F(ds4_bridge_spec_counters_t, committed);
    F(ds4_bridge_spec_counters_t, draft_max);
    F(ds4_bridge_spec_counters_t, draft_width);

    S(ds4_bridge_expert_stats_t);
    F(ds4_bridge_expert_stats_t, streaming);
    F(ds4_bridge_expert_stats_t, acquired);
    F(ds4_bridge_expert_stats_t, misses);
    F(ds4_bridge_expert_stats_t, late);
    F(ds4_bridge_expert_stats_t, prefetched);
    F(ds4_bridge_expert_stats_t, prefetch_used);
    F(ds4_bridge_expert_stats_t, bytes_read);
    F(ds4_bridge_expert_stats_t, store_reads);
    F(ds4_bridge_expert_stats_t, store_corrupt);
    F(ds4_bridge_expert_stats_t, demand_read_ns);
    F(ds4_bridge_expert_stats_t, prefetch_read_ns);
    F(ds4_bridge_expert_stats_t, wait_ns);
    F(ds4_bridge_expert_stats_t, io_busy_ns);
    F(ds4_bridge_expert_stats_t, resident);
    F(ds4_bridge_expert_stats_t, capacity);
    F(ds4_bridge_expert_stats_t, capacity_bytes);
    S(ds4_bridge_expert_stats_ex_t);
    F(ds4_bridge_expert_stats_ex_t, base);
    F(ds4_bridge_expert_stats_ex_t, tiers);
    F(ds4_bridge_expert_stats_ex_t, host_misses);
    F(ds4_bridge_expert_stats_ex_t, host_bytes_read);
    F(ds4_bridge_expert_stats_ex_t, host_capacity_bytes);

    S(ds4_bridge_spec_row);
    F(ds4_bridge_spec_row, session);
    F(ds4_bridge_spec_row, pending);
    F(ds4_bridge_spec_row, temperature);
    F(ds4_bridge_spec_row, top_k);
    F(ds4_bridge_spec_row, top_p);
    F(ds4_bridge_spec_row, min_p);
    F(ds4_bridge_spec_row, rng);
    F(ds4_bridge_spec_row, max_new);
    F(ds4_bridge_spec_row, tokens);
    F(ds4_bridge_spec_row, argmax);
    F(ds4_bridge_spec_row, cap);
    F(ds4_bridge_spec_row, width);
    F(ds4_bridge_spec_row, accepted);

    S(ds4_bridge_batch_stats_t);
    F(ds4_bridge_batch_stats_t, steps);
    F(ds4_bridge_batch_stats_t, rows);
    F(ds4_bridge_batch_stats_t, sessions);
    F(ds4_bridge_batch_stats_t, failed);

    S(ds4_bridge_gguf_info_t);
    F(ds4_bridge_gguf_info_t, family);
    F(ds4_bridge_gguf_info_t, name);
    F(ds4_bridge_gguf_info_t, n_layer);
    F(ds4_bridge_gguf_info_t, n_embd);
    F(ds4_bridge_gguf_info_t, n_vocab);
    F(ds4_bridge_gguf_info_t, n_head);
    F(ds4_bridge_gguf_info_t, n_expert);
    F(ds4_bridge_gguf_info_t, n_tensors);
    F(ds4_bridge_gguf_info_t, split_count);
    F(ds4_bridge_gguf_info_t, tensor_bytes);

    S(ds4_bridge_gguf_tensor_t);
    F(ds4_bridge_gguf_tensor_t, name);
    F(ds4_bridge_gguf_tensor_t, type);
    F(ds4_bridge_gguf_tensor_t, n_dims);
    F(ds4_bridge_gguf_tensor_t, ne);
    F(ds4_bridge_gguf_tensor_t, split);
    F(ds4_bridge_gguf_tensor_t, offset);
    F(ds4_bridge_gguf_tensor_t, nbytes);

    S(ds4_bridge_host_tensor);
    F(ds4_bridge_host_tensor, name);
    F(ds4_bridge_host_tensor, type);
    F(ds4_bridge_host_tensor, n_dims);
    F(ds4_bridge_host_tensor, ne);
    F(ds4_bridge_host_tensor, split);
    F(ds4_bridge_host_tensor, offset);
    F(ds4_bridge_host_tensor, nbytes);

    S(ds4_bridge_tensor_directory);
    F(ds4_bridge_tensor_directory, tensors);
    F(ds4_bridge_tensor_directory, n_tensors);
    F(ds4_bridge_tensor_directory, n_splits);
    F(ds4_bridge_tensor_directory, split_data_offset);

    S(ds4_bridge_bind_plan);
    F(ds4_bridge_bind_plan, names);
    F(ds4_bridge_bind_plan, slots);
    F(ds4_bridge_bind_plan, n);
    return 0;
}
