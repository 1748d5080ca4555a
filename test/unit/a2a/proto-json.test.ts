import { describe, expect, it } from 'vitest';
import { withJsonNames } from '../../../src/a2a/proto-json.js';

describe('withJsonNames', () => {
  it('maps proto field names to JSON names, deeply, leaving metadata and data contents alone', () => {
    expect(
      withJsonNames({
        history_length: 2,
        message: { message_id: 'm', task_id: 't', parts: [{ data: { snake_key: 1 }, media_type: 'application/json' }], metadata: { my_key: 'v' } },
        configuration: { return_immediately: true, task_push_notification_config: { url: 'u' } },
      }),
    ).toEqual({
      historyLength: 2,
      message: { messageId: 'm', taskId: 't', parts: [{ data: { snake_key: 1 }, mediaType: 'application/json' }], metadata: { my_key: 'v' } },
      configuration: { returnImmediately: true, taskPushNotificationConfig: { url: 'u' } },
    });
  });

  it('prefers the JSON name when both are present, and leaves scalars and arrays as they are', () => {
    expect(withJsonNames({ taskId: 'json', task_id: 'proto' })).toEqual({ taskId: 'json' });
    expect(withJsonNames([1, 'a_b', null])).toEqual([1, 'a_b', null]);
    expect(withJsonNames(null)).toBeNull();
  });
});
