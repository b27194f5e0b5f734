// The core's own job tables as option schemas: [trainer], [launch], [plugins] and the keys the
// core reads in each [[rewards]] entry (the rest of an entry is its plugin's). Validated by
// config.cpp as a plugin's schema is (moved out of config.cpp, which keeps the validation).
#include "trainrun/core/config.hpp"

namespace trainrun::core {

v1::OptionSchema trainer_schema() {
  v1::OptionSchema s;
  s.integer("max_steps", 0, "Optimizer steps to run; 0 = use max_epochs", 0, 1e15);
  s.integer("max_epochs", 0, "Passes over the training split when max_steps = 0", 0, 1e9);
  s.integer("global_batch_size", 32,
            "Samples per optimizer step across all ranks (micro_batch_size x accumulation x "
            "world_size)",
            1, 1e9);
  s.integer("micro_batch_size", 0,
            "Samples per forward/backward on one rank; 0 = global_batch_size / world_size", 0, 1e9);
  s.integer("eval_batch_size", 0, "Samples per evaluation batch; 0 = micro_batch_size", 0, 1e9);
  s.integer("seed", 0, "Seed of every random stream (same seed -> identical run on CPU)", 0,
            9.007e15);
  s.string("run_dir", "", "Output directory; \"\" = runs/<job file name>");
  s.integer("eval_every", 0, "Evaluate every N steps (and always at the end); 0 = only at the end",
            0, 1e15);
  s.boolean("eval_on_start", false,
            "Also evaluate before the first step (Hugging Face Trainer's eval_on_start): the "
            "starting point of the held-out figures");
  s.integer("eval_max_batches", 0,
            "Cap on evaluation batches per rank per evaluation (as Lightning's "
            "limit_val_batches); 0 = whole split",
            0, 1e15);
  s.boolean("drop_last", true,
            "End of an epoch: skip the samples that do not fill a whole global batch (true), or "
            "pad the last global batch by repeating the epoch's first samples (false)");
  s.boolean("save_final_model", true,
            "At the end, rank 0 writes the strategy's full state dict to "
            "<run_dir>/model.safetensors (atomically)");
  s.choice("state_dict_type", "full", {"full", "sharded"},
           "What save_final_model writes (PyTorch FSDP's names): \"full\" = the gathered model "
           "in <run_dir>/model.safetensors; \"sharded\" = each rank its own pieces, no gather, in "
           "<run_dir>/model-shards/rank-R-of-W.safetensors (strategies zero and fsdp)");
  s.string("init_weights", "",
           "A safetensors file (e.g. a run's model.safetensors) whose tensors replace the "
           "model's parameters and buffers of the same names before training; every name and "
           "shape must match; \"\" = the model's own initialisation");
  s.choice("reference_model", "auto", {"auto", "adapters_off", "precomputed"},
           "The reference model of an [objective] that needs one (DPO): \"adapters_off\" = the "
           "trained model with its LoRA adapters switched off, one extra no-grad forward per "
           "micro-batch (PEFT's disable_adapter()); \"precomputed\" = the initial model's values "
           "computed once before training for every sample and kept in "
           "<run_dir>/reference/logps.safetensors, which a resumed run reuses (TRL's "
           "precompute_ref_log_probs); \"auto\" = adapters_off under LoRA, else precomputed");
  s.string_list("freeze", {},
                "Parameters to freeze (requires_grad off) before the strategy wraps the model: "
                "state-dict names or shell-style globs (\"blocks.0.*\", \"*.bias\"); each "
                "pattern must match at least one parameter");
  s.string("resume", "",
           "Continue from a checkpoint: \"latest\" (the checkpoints directory's `latest`), "
           "\"latest-valid\" (the newest one whose checksums verify, falling back past corrupt "
           "ones), or a step-NNNNNNN directory; \"\" = start fresh. Model, optimizer, loss "
           "scaler, step, data position and RNG are restored (bitwise-exact on CPU fp32)");
  s.integer("stop_after_steps", 0,
            "End this process once this many steps (counted from step 0) are done, saving a "
            "checkpoint when a `checkpoint` callback is listed, without final evaluation (for "
            "time-sliced or preemptible queues; the schedule still runs to max_steps); 0 = off",
            0, 1e15);
  s.integer("log_every", 10, "Log metrics every N steps", 1, 1e15);
  s.real("gradient_clip_val", 0.0,
         "Clip gradients (after unscaling): to this global L2 norm, or each element to "
         "[-value, value] (gradient_clip_algorithm); 0 = off",
         0, 1e30);
  s.real("max_skipped_fraction", 0.5,
         "A run that skipped more than this fraction of its steps (non-finite loss or "
         "gradients) ends with exit code 3 and a diagnosis; a run whose weights become "
         "non-finite stops at once with exit code 3",
         0, 1);
  s.choice("gradient_clip_algorithm", "norm", {"norm", "value"},
           "How gradient_clip_val clips (Lightning's names): \"norm\" scales all gradients by "
           "val / global L2 norm when the norm exceeds val (across ranks and shards); \"value\" "
           "clamps each gradient element to [-val, val]");
  s.boolean("activation_checkpointing", false,
            "Recompute each sharding unit's forward during backward instead of storing its "
            "activations (the model's units, e.g. gpt's blocks; see "
            "activation_checkpointing_units)");
  s.string_list("activation_checkpointing_units", {},
                "With activation_checkpointing = true: only these units (names as the model "
                "gives them, e.g. \"blocks.0\"); empty = every unit");
  return s;
}

v1::OptionSchema launch_schema() {
  v1::OptionSchema s;
  s.integer("nproc_per_node", 1, "Worker processes (ranks) on this node", 1, 4096);
  s.integer("nnodes", 1, "Number of nodes", 1, 65536);
  s.integer("node_rank", 0, "This node's index in [0, nnodes)", 0, 65535);
  s.string("master_addr", "127.0.0.1", "Address of node 0's rendezvous store");
  s.integer("master_port", 0, "Port of the rendezvous store; 0 = pick a free one (nnodes = 1 only)",
            0, 65535);
  s.choice("store_listen", "master_addr", {"master_addr", "all"},
           "Where node 0's rendezvous store listens: only on master_addr (the default), or on "
           "every interface (\"all\"); the store has no authentication, so anyone who reaches "
           "its port can read and change the job's rendezvous keys");
  s.duration("rendezvous_timeout_s", 300.0,
             "How long agents and workers wait for each other to arrive", 0.1, 1e7);
  s.duration("stop_grace_s", 5.0,
             "When stopping workers: SIGTERM, then SIGKILL after this long unless the worker "
             "is writing a checkpoint (then stop_save_timeout_s applies)",
             0.0, 3600.0);
  s.duration("stop_save_timeout_s", 600.0,
             "When stopping workers: a worker that is writing a checkpoint is killed only this "
             "long after its save began (keep stop_grace_s + this below the cluster's own "
             "kill delay: SLURM KillWait, Kubernetes terminationGracePeriodSeconds)",
             0.0, 1e6);
  s.integer(
      "max_restarts", 0,
      "Elastic restarts (trainrun's agent, any nnodes): when a worker fails or a node's agent "
      "is replaced, stop all workers on every node, start them again and resume from the "
      "latest checkpoint (`checkpoint` callback; a run_dir every node shares), at most this "
      "many times; 0 = a failure ends the job",
      0, 1000);
  s.choice("launcher", "auto", {"auto", "trainrun", "mpiexec"},
           "How workers are started: trainrun's own agent, or MPICH's mpiexec; auto = mpiexec "
           "when [accelerator] plugin is \"mpi\", else trainrun");
  s.string("blas_coretype", "auto",
           "OpenBLAS kernel set of the ranks (OPENBLAS_CORETYPE): auto = this CPU's best where "
           "OpenBLAS picked a lower ISA tier, after a probe; off = OpenBLAS's choice; or a name "
           "such as \"SkylakeX\" or \"Haswell\"");
  return s;
}

v1::OptionSchema parallel_schema() {
  v1::OptionSchema s;
  s.integer("ep", 1,
            "Expert parallelism: a mixture-of-experts model's experts split over groups of this "
            "many consecutive ranks (each holds num_experts / ep of every MoE layer, tokens travel "
            "to their experts by all_to_all); it must divide the world size and the experts. "
            "The other parameters are the [strategy]'s; 1 = every rank holds every expert",
            1, 4096);
  return s;
}

v1::OptionSchema eval_schema() {
  v1::OptionSchema s;
  s.string_list("tasks", {},
                "lm-eval YAML task files or directories of them (eval/tasks/ ships some), scored "
                "with the model whenever the run evaluates ([trainer] eval_every, eval_on_start, "
                "the end); [] = none (docs/evaluation.md)");
  s.integer("num_fewshot", -1,
            "Few-shot examples per document for every task; -1 = each task's own", -1, 1e6);
  s.integer("limit", 0, "The first N documents of each task; 0 = all", 0, 1e15);
  s.integer("fewshot_seed", 1234, "Seed of the few-shot sampler (lm-eval's default 1234)", 0,
            4294967295.0);
  s.integer("batch_size", 8, "Requests per forward pass on each rank", 1, 1e6);
  s.integer("max_length", 0,
            "Tokens per input at most; 0 = [model] path's config.json max_position_embeddings", 0,
            1e9);
  s.string("tokenizer", "", "Directory of tokenizer.json; \"\" = [model] path");
  s.boolean("log_samples", true,
            "Also write each document's requests, answers and metrics (samples_<task>.jsonl)");
  return s;
}

v1::OptionSchema plugins_schema() {
  v1::OptionSchema s;
  s.string_list("path", {}, "Plugin directories or files, searched after --plugin-path");
  return s;
}

v1::OptionSchema reward_entry_schema() {
  v1::OptionSchema s;
  s.real("weight", 1.0,
         "factor of this reward in the weighted sum of the rewards (TRL's reward_weights); "
         "negative values penalise");
  s.string("name", "", "name in metrics (rewards/<name>/mean) and messages; default the plugin's");
  return s;
}

}  // namespace trainrun::core
