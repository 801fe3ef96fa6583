// Every worker's check of a job's data against its queue's payload (JOB_PAYLOAD_SCHEMAS), before its
// processor runs. The outbox writes only payloads that match, and the queue dashboard checks a job
// added by hand; a job from anywhere else (a script, redis-cli, an older release) that does not match
// would fail somewhere inside the processor, retried with backoff, for a reason nobody can read.
import { UnrecoverableError, type Processor } from 'bullmq';
import type { Logger } from '../domain/logger.ts';
import { compileSchema, fieldErrors } from '../domain/schema-check.ts';
import { JOB_PAYLOAD_SCHEMAS, type JobPayloads, type QueueName } from './names.ts';

// Unrecoverable: no retry mends the data. Its message names the paths and rules broken, never a value.
export class JobPayloadMismatch extends UnrecoverableError {}

export function checkingPayload<Q extends QueueName, R>(queue: Q, processor: Processor<JobPayloads[Q], R>, log: Logger): Processor<JobPayloads[Q], R> {
  const validate = compileSchema(JOB_PAYLOAD_SCHEMAS[queue]);
  return async (job, token) => {
    const errors = fieldErrors(validate, job.data, 'data');
    if (errors.length) {
      const reason = `job data does not match the ${queue} payload: ${errors.map((e) => `${e.path} ${e.message}`).join('; ')}`;
      // Not the data: it came from outside the code that writes payloads, and may hold anything.
      log.warn({ queue, job_id: job.id, reason }, 'job failed without retries: its data is not its queue\'s payload');
      throw new JobPayloadMismatch(reason);
    }
    return processor(job, token);
  };
}
